# Entry points; the scripts in hack/ hold the logic.
GO ?= go

.PHONY: build demo test tools bench-catalog bench-pull bench-serve bench-propagation clean

build:
	$(GO) build -o bin/osimages ./cmd/osimages

demo:
	$(GO) run ./cmd/osimages demo

test:
	hack/test.sh

tools:
	hack/tools.sh

bench-catalog:
	hack/bench-catalog.sh

bench-pull:
	hack/bench-pull.sh

bench-serve:
	hack/bench-serve.sh

bench-propagation:
	hack/bench-propagation.sh

clean:
	rm -rf bin

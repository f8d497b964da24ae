# Entry points; the scripts in hack/ hold the logic.
GO ?= go

.PHONY: build image demo test e2e e2e-up e2e-down e2e-metal3 e2e-metal3-down bench-metal3 docs tools bench-catalog bench-pull bench-serve bench-propagation bench-fleet bench-scale bench-idle bench-ipa clean

# Production builds leave the demo out (-tags nodemo): no in-process registry
# ships to management clusters. `go run ./cmd/osimages demo` keeps it.
build:
	$(GO) build -tags nodemo -o bin/osimages ./cmd/osimages

# The container image, without a container daemon: a static binary on an
# empty base (internal/containerimage). Push bin/image/oci with
# `oras cp --from-oci-layout bin/image/oci:$(IMAGE_TAG) REGISTRY/osimages:$(IMAGE_TAG)`
# or `crane push bin/image/oci REGISTRY/osimages:$(IMAGE_TAG)`.
GOARCH ?= $(shell $(GO) env GOARCH)
IMAGE_TAG ?= dev
IMAGE_REF ?= osimages:$(IMAGE_TAG)
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

image:
	CGO_ENABLED=0 GOOS=linux GOARCH=$(GOARCH) $(GO) build -tags nodemo -trimpath -ldflags "-s -w" -o bin/linux_$(GOARCH)/osimages ./cmd/osimages
	$(GO) run ./hack/image --binary bin/linux_$(GOARCH)/osimages --arch $(GOARCH) \
	  --layout bin/image/oci --tarball bin/image/osimages-$(GOARCH).tar --tag $(IMAGE_REF) \
	  --labels org.opencontainers.image.title=osimages,org.opencontainers.image.version=$(VERSION),org.opencontainers.image.source=https://gitlab.com/sylva-projects/osimages

demo:
	$(GO) run ./cmd/osimages demo

test:
	hack/test.sh

# The chart and the image on a real one-node Kubernetes cluster, in a
# network namespace of its own (root). E2E_ARGS: -run REGEXP, -keep.
e2e:
	hack/e2e.sh $(E2E_ARGS)
	$(if $(E2E_ARGS),,hack/e2e-metal3.sh run)

# Metal3 in a box (root): Ironic 29 and IPA provision a qemu host from the
# image osimages serves, in a network namespace of its own; `make e2e` runs
# it after the cluster's scenarios (unless E2E_ARGS narrows them).
e2e-metal3:
	hack/e2e-metal3.sh run

# Stop a box a killed run left behind, and check nothing of it is left.
e2e-metal3-down:
	hack/e2e-metal3.sh down

# The same deploy from osimages and from nginx serving the same file.
bench-metal3:
	hack/e2e-metal3.sh bench

# The same cluster, left running for kubectl (hack/e2e-cluster.sh kubectl ...).
e2e-up:
	hack/e2e.sh -run '^$$' -keep

e2e-down:
	hack/e2e-cluster.sh down
	hack/e2e-cluster.sh check-clean

# docs/cli.md is generated from the cobra commands (cmd/osimages/docs_test.go);
# make test fails when it is stale.
docs:
	$(GO) test -count=1 -run '^TestCLIDocs$$' ./cmd/osimages -args -update

tools:
	hack/tools.sh

bench-catalog:
	hack/bench-catalog.sh

bench-pull:
	hack/bench-pull.sh

bench-serve:
	hack/bench-serve.sh $(BENCH_ARGS)

bench-propagation:
	hack/bench-propagation.sh

# Server replicas under tc shaping, in a network namespace of its own
# (root): the scale-out scenarios, three runs each; exits non-zero when a
# target is missed. BENCH_ARGS: -scenarios orderly,failover -size 268435456 ...
bench-scale:
	hack/bench-scale.sh $(BENCH_ARGS)

# ironic-python-agent's own download of a 1 GiB raw image from osimages and
# from nginx serving the same file.
bench-ipa:
	hack/bench-ipa.sh $(BENCH_ARGS)

# The production server's idle RSS and the package init every command pays.
bench-idle:
	hack/idle-rss.sh

# 500 workload namespaces: from a served-set change to every osimages-status.
bench-fleet:
	eval "$$(hack/tools.sh env)" && go test -run '^$$' -bench FleetReaction -benchtime 3x ./internal/controller

clean:
	rm -rf bin

// Command image builds the osimages container image from a static binary,
// without a container daemon (`make image` runs it). See
// internal/containerimage.
//
//	go run ./hack/image --binary bin/linux_amd64/osimages --arch amd64 \
//	  --layout bin/image/oci --tarball bin/image/osimages.tar --tag osimages:dev
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sylva-projects/osimages/internal/containerimage"
)

func main() {
	var (
		o       containerimage.Options
		layout  = flag.String("layout", "", "write an OCI image layout directory here")
		tarball = flag.String("tarball", "", "write a docker-save style tarball here")
		ref     = flag.String("tag", "osimages:dev", "image reference of the tarball; its tag names the image in the layout")
		labels  = flag.String("labels", "", "comma-separated key=value image labels")
	)
	flag.StringVar(&o.Binary, "binary", "", "static osimages binary (CGO_ENABLED=0)")
	flag.StringVar(&o.Arch, "arch", "amd64", "GOARCH of the binary")
	flag.StringVar(&o.Entrypoint, "entrypoint", containerimage.DefaultEntrypoint, "the binary's path in the image (in its root folder)")
	flag.StringVar(&o.CACerts, "ca-certs", containerimage.DefaultCACerts, "PEM bundle shipped as the image's system CAs")
	flag.Parse()
	if *layout == "" && *tarball == "" {
		fail(fmt.Errorf("give --layout, --tarball or both"))
	}
	o.Labels = map[string]string{}
	for _, kv := range strings.Split(*labels, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			fail(fmt.Errorf("--labels %q: want key=value", kv))
		}
		o.Labels[k] = v
	}
	// SOURCE_DATE_EPOCH, the reproducible-builds convention, dates the image;
	// without it the epoch, so that the digest depends only on the inputs.
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			fail(fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err))
		}
		o.Created = time.Unix(sec, 0)
	}
	img, err := containerimage.Build(o)
	if err != nil {
		fail(err)
	}
	tag := *ref
	if i := strings.LastIndex(tag, ":"); i >= 0 && !strings.Contains(tag[i:], "/") {
		tag = tag[i+1:]
	}
	if *layout != "" {
		if err := containerimage.WriteLayout(img, *layout, tag); err != nil {
			fail(err)
		}
	}
	if *tarball != "" {
		if err := containerimage.WriteTarball(img, *tarball, *ref); err != nil {
			fail(err)
		}
	}
	digest, err := img.Digest()
	if err != nil {
		fail(err)
	}
	size, err := containerimage.CompressedSize(img)
	if err != nil {
		fail(err)
	}
	fmt.Fprintf(os.Stderr, "image %s (%s): %s, %.1f MiB compressed\n", *ref, o.Arch, digest, float64(size)/(1<<20))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "image:", err)
	os.Exit(1)
}

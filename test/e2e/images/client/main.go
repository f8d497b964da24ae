// Command client is the client pod of the end-to-end scenarios:
//
//	client fetch URL SHA256            download URL once, check its sha256; exit 0 when it matches;
//	                                   an oci://HOST/REPO@DIGEST (or :TAG) URL is read as a registry client
//	                                   does (plain HTTP): its manifest, then its one layer
//	client fetch --loop URL SHA256     download it again and again until SIGTERM
//	client api CHECKS                  make the requests CHECKS lists (JSON: [{"method", "path", "body"}])
//	                                   to the apiserver with the pod's own ServiceAccount token
//
// Each attempt or request is one JSON line on standard output, which the
// scenarios read back from the pod's log.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"

	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// Attempt is one download.
type Attempt struct {
	Time   time.Time `json:"time"`
	OK     bool      `json:"ok"`
	Status int       `json:"status,omitempty"`
	Bytes  int64     `json:"bytes"`
	Millis int64     `json:"ms"`
	SHA256 string    `json:"sha256,omitempty"`
	Error  string    `json:"error,omitempty"`
}

// Check is one apiserver request and its answer.
type Check struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	Body   string `json:"body,omitempty"`
	Status int    `json:"status"`
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	switch os.Args[1] {
	case "fetch":
		fs := flag.NewFlagSet("fetch", flag.ExitOnError)
		loop := fs.Bool("loop", false, "download again and again until SIGTERM")
		pause := fs.Duration("pause", 200*time.Millisecond, "with --loop, the pause between downloads")
		fs.Parse(os.Args[2:])
		if fs.NArg() != 2 {
			usage()
		}
		os.Exit(fetch(ctx, fs.Arg(0), strings.ToLower(fs.Arg(1)), *loop, *pause))
	case "api":
		if len(os.Args) != 3 {
			usage()
		}
		os.Exit(api(ctx, os.Args[2]))
	default:
		usage()
	}
}

// indexedManifest resolves the tag of oci://HOST/REPO:TAG to the digest of
// the one manifest of the index it answers, as Ironic does.
func indexedManifest(ctx context.Context, client *http.Client, host, repo, tag string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/v2/"+repo+"/manifests/"+tag, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var idx struct {
		Manifests []struct {
			Digest string `json:"digest"`
		} `json:"manifests"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("tag %s: %s", tag, resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&idx); err != nil || len(idx.Manifests) != 1 {
		return "", fmt.Errorf("tag %s: want an index of one manifest (%v)", tag, err)
	}
	return idx.Manifests[0].Digest, nil
}

// layerURL reads the manifest of oci://HOST/REPO@DIGEST (or of the one
// manifest of the index of oci://HOST/REPO:TAG) over plain HTTP, checks
// its digest, and returns the URL of its one layer.
func layerURL(ctx context.Context, client *http.Client, ref string) (string, error) {
	host, path, _ := strings.Cut(strings.TrimPrefix(ref, "oci://"), "/")
	repo, digest, ok := strings.Cut(path, "@")
	if !ok {
		var tag string
		if repo, tag, ok = strings.Cut(path, ":"); !ok {
			return "", fmt.Errorf("%s: want oci://HOST/REPO@DIGEST or oci://HOST/REPO:TAG", ref)
		}
		var err error
		if digest, err = indexedManifest(ctx, client, host, repo, tag); err != nil {
			return "", err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/v2/"+repo+"/manifests/"+digest, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("manifest %s: %s", digest, resp.Status)
	}
	if sum := sha256.Sum256(body); "sha256:"+hex.EncodeToString(sum[:]) != digest {
		return "", fmt.Errorf("manifest %s: its bytes hash to sha256:%x", digest, sum)
	}
	var m struct {
		Layers []struct {
			Digest string `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(body, &m); err != nil || len(m.Layers) != 1 {
		return "", fmt.Errorf("manifest %s: want one layer: %s", digest, body)
	}
	return "http://" + host + "/v2/" + repo + "/blobs/" + m.Layers[0].Digest, nil
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: client fetch [--loop] URL SHA256 | client api CHECKS-JSON")
	os.Exit(2)
}

func fetch(ctx context.Context, url, want string, loop bool, pause time.Duration) int {
	// A fresh connection each time, as a booting host makes: every
	// download goes through the Service's load balancing again.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	enc := json.NewEncoder(os.Stdout)
	for {
		a := download(ctx, client, url, want)
		if ctx.Err() != nil && !a.OK {
			return 0 // stopped mid-download: not a failure of the server
		}
		enc.Encode(a)
		if !loop {
			if a.OK {
				return 0
			}
			return 1
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(pause):
		}
	}
}

func download(ctx context.Context, client *http.Client, url, want string) (a Attempt) {
	a.Time = time.Now().UTC()
	defer func() { a.Millis = time.Since(a.Time).Milliseconds() }()
	if strings.HasPrefix(url, "oci://") {
		blob, err := layerURL(ctx, client, url)
		if err != nil {
			a.Error = err.Error()
			return a
		}
		url = blob
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	resp, err := client.Do(req)
	if err != nil {
		a.Error = err.Error()
		return a
	}
	defer resp.Body.Close()
	a.Status = resp.StatusCode
	h := sha256.New()
	a.Bytes, err = io.Copy(h, resp.Body)
	a.SHA256 = hex.EncodeToString(h.Sum(nil))
	switch {
	case err != nil:
		a.Error = err.Error()
	case resp.StatusCode != http.StatusOK:
		a.Error = "status " + resp.Status
	case resp.ContentLength >= 0 && resp.ContentLength != a.Bytes:
		a.Error = fmt.Sprintf("Content-Length %d, got %d bytes", resp.ContentLength, a.Bytes)
	case a.SHA256 != want:
		a.Error = "sha256 mismatch: want " + want
	default:
		a.OK = true
	}
	return a
}

// api makes each request of checks to the apiserver the pod's environment
// names, with the token and CA of the pod's ServiceAccount, and prints the
// answers: it proves what the token may do with real requests, not with
// SubjectAccessReviews.
func api(ctx context.Context, checks string) int {
	var list []Check
	if err := json.Unmarshal([]byte(checks), &list); err != nil {
		fmt.Fprintln(os.Stderr, "CHECKS:", err)
		return 2
	}
	token, err := os.ReadFile(saDir + "/token")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ca, err := os.ReadFile(saDir + "/ca.crt")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		fmt.Fprintln(os.Stderr, saDir+"/ca.crt: no certificate")
		return 1
	}
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		fmt.Fprintln(os.Stderr, "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not in a pod?")
		return 1
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	base := "https://" + host + ":" + port
	enc := json.NewEncoder(os.Stdout)
	for _, c := range list {
		var body io.Reader
		if c.Body != "" {
			body = bytes.NewReader([]byte(c.Body))
		}
		req, err := http.NewRequestWithContext(ctx, c.Method, base+c.Path, body)
		if err != nil {
			c.Error = err.Error()
			enc.Encode(c)
			continue
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		req.Header.Set("Accept", "application/json")
		switch c.Method {
		case http.MethodPatch:
			req.Header.Set("Content-Type", "application/merge-patch+json")
		default:
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			c.Error = err.Error()
			enc.Encode(c)
			continue
		}
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		c.Status = resp.StatusCode
		var status struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		}
		if json.Unmarshal(data, &status) == nil && status.Message != "" {
			c.Reason = status.Reason + ": " + status.Message
		}
		enc.Encode(c)
	}
	if ctx.Err() != nil {
		return 1
	}
	return 0
}

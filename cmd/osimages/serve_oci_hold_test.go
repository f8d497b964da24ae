package main

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// holdAnswer is what a client of the server got: the status, the headers
// that say what the body is, and the body's sha256 and size.
type holdAnswer struct {
	code                      int
	retryAfter, contentType   string
	contentDigest, bodySHA256 string
	body                      []byte
	took                      time.Duration
	err                       error
}

// getTraced GETs url and sends on written once the whole request is on
// the wire, so that the test knows the server has it without timing it.
func getTraced(url string, written chan<- string) holdAnswer {
	trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
		select {
		case written <- url:
		default: // told already
		}
	}}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return holdAnswer{err: err}
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	began := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return holdAnswer{err: err, took: time.Since(began)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	h := sha256.Sum256(body)
	return holdAnswer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), contentType: resp.Header.Get("Content-Type"),
		contentDigest: resp.Header.Get("Docker-Content-Digest"), bodySHA256: hex.EncodeToString(h[:]), body: body, took: time.Since(began), err: err}
}

// getAll GETs every URL at once, and returns once each request is written
// (or answered); the answers arrive on the channel of each URL.
func getAll(t *testing.T, urls []string) map[string]chan holdAnswer {
	t.Helper()
	written := make(chan string, len(urls))
	answers := map[string]chan holdAnswer{}
	for _, u := range urls {
		answers[u] = make(chan holdAnswer, 1)
		go func() { answers[u] <- getTraced(u, written) }()
	}
	for range urls {
		select {
		case <-written:
		case <-time.After(60 * time.Second):
			t.Fatal("the requests were not written to the server in 60s")
		}
	}
	return answers
}

// downloadingOnPage says whether the status page shows an image being
// downloaded: its row's state, not the word, which the page's style sheet
// holds whatever the state.
func downloadingOnPage(page string) bool {
	return strings.Contains(page, `<span class="phase downloading">downloading</span>`)
}

// answerOf waits for the answer on ch: the server holds a client at most
// --client-hold, and sends a few MiB once it answers.
func answerOf(t *testing.T, url string, ch chan holdAnswer) holdAnswer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(5 * time.Minute):
		t.Fatalf("GET %s: no answer in 5 minutes", url)
		return holdAnswer{}
	}
}

// TestServeOCIHoldsClientsDuringAFill: a client of the OCI distribution
// face is held during a fill as a client of the image URLs is (issue 36:
// Ironic's agent ignores Retry-After and gives an oci:// deploy 10 tries 10
// s apart, so a 503 at once failed a deploy that the image URL's hold lets
// through). Through the real `osimages serve`, filling from a real
// registry whose blob is withheld until the test releases it: a GET of the
// layer blob, of the disk type's tag (manifests/raw) and of the image URL,
// made while the fill waits, is not answered until the fill ends, then
// gets the verified bytes; with a shorter --client-hold, the same requests
// are answered 503 with Retry-After once it has passed, not before.
func TestServeOCIHoldsClientsDuringAFill(t *testing.T) {
	const size = 4 << 20
	// The registry withholds the blob longer than its default 60 s may
	// take on a busy machine: the fill must not be cut meanwhile, or the
	// failed image would not be waited for.
	stall := []string{"--stall-timeout", "10m"}
	urlsOf := func(e *ipaEnv) (image, blob, manifest string) {
		repo := "/v2/" + osimage.OCIRepository(e.sum)
		return e.imageURL(), e.d.url(repo + "/blobs/sha256:" + string(e.sum)), e.d.url(repo + "/manifests/raw")
	}
	downloading := func(t *testing.T, e *ipaEnv) {
		t.Helper()
		testenv.Eventually(t, "the server's fill started", 60*time.Second, func() (bool, string) {
			code, page := get(e.d.url("/"))
			return code == 200 && downloadingOnPage(page), page
		})
	}

	t.Run("held until verified", func(t *testing.T) {
		e := startIPAEnv(t, size, true, append(stall, "--client-hold", "10m")...)
		downloading(t, e)
		image, blob, manifest := urlsOf(e)
		answers := getAll(t, []string{image, blob, manifest})
		// Asked after the three requests were on the wire, the status page
		// still shows the fill: they reached the server during it.
		downloading(t, e)
		for u, ch := range answers {
			select {
			case a := <-ch:
				t.Fatalf("GET %s answered %d %q (%v) during the fill, want it held", u, a.code, a.body, a.err)
			default:
			}
		}
		close(e.gate)

		for _, u := range []string{image, blob} {
			a := answerOf(t, u, answers[u])
			if a.err != nil || a.code != http.StatusOK || a.bodySHA256 != string(e.sum) || int64(len(a.body)) != e.size {
				t.Errorf("GET %s held during the fill: %d, %v, %d bytes of sha256 %s; want 200 and the image's %d bytes of sha256 %s",
					u, a.code, a.err, len(a.body), a.bodySHA256, e.size, e.sum)
			}
			if u == blob && a.contentDigest != "sha256:"+string(e.sum) {
				t.Errorf("GET %s: Docker-Content-Digest %q, want sha256:%s", u, a.contentDigest, e.sum)
			}
		}
		// The disk type's index, the same as once the image is verified.
		a := answerOf(t, manifest, answers[manifest])
		if a.err != nil || a.code != http.StatusOK || a.contentType != ocispec.MediaTypeImageIndex || a.contentDigest != "sha256:"+a.bodySHA256 {
			t.Fatalf("GET %s held during the fill: %d, %v, %s, Docker-Content-Digest %q of a body of sha256 %s; want 200 and the index\n%s",
				manifest, a.code, a.err, a.contentType, a.contentDigest, a.bodySHA256, a.body)
		}
		if after := getTraced(manifest, make(chan string, 1)); after.code != http.StatusOK || string(after.body) != string(a.body) {
			t.Errorf("GET %s once verified: %d %s, want the index the held request got: %s", manifest, after.code, after.body, a.body)
		}
	})

	t.Run("503 past the hold", func(t *testing.T) {
		const hold = 3 * time.Second
		e := startIPAEnv(t, size, true, append(stall, "--client-hold", hold.String())...)
		downloading(t, e)
		image, blob, manifest := urlsOf(e)
		answers := getAll(t, []string{image, blob, manifest})
		for _, u := range []string{image, blob, manifest} {
			a := answerOf(t, u, answers[u])
			// took is measured from before the request was sent: at least
			// the hold, whatever the machine's load.
			if a.err != nil || a.code != http.StatusServiceUnavailable || a.retryAfter == "" || a.took < hold {
				t.Errorf("GET %s during a fill: %d, Retry-After %q, %v, after %v; want 503 with Retry-After once --client-hold %v has passed\n%s",
					u, a.code, a.retryAfter, a.err, a.took, hold, a.body)
			}
		}
		// Still filling: the 503s are the hold's end, not a failed fill's.
		downloading(t, e)
	})
}

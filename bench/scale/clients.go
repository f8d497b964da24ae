package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Clients behave as Ironic does with an image URL: the conductor's HEAD
// (HttpImageService.show: anything but 200 fails the deploy), the
// checksum file beside the image, then the download, checked in transit.
// Ironic's conductor does not retry; its agent retries a failed download
// 9 times, 10 s apart. The clients here record the first answer that was
// not 200 (what the conductor would have failed the host on) and retry as
// the agent does (after Retry-After, at most 10 s), to tell a client that
// waited from one that never got the image.
const (
	clientRetries    = 9
	clientRetryAfter = 10 * time.Second
)

// clientResult is what one client got.
type clientResult struct {
	// firstFailure is the first answer that was not the image, "" when
	// there was none: Ironic's conductor fails the host on it.
	firstFailure string
	// err is the last failure when every attempt failed.
	err   error
	tries int
	done  time.Duration // from the clients' start to the last byte
}

// runClients starts n clients, client c on replicas[c % len]: the
// Service spreads connections over the replicas.
func runClients(ctx context.Context, n int, replicas []*replica, img image) []clientResult {
	results := make([]clientResult, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for c := range n {
		r := replicas[c%len(replicas)]
		wg.Go(func() {
			results[c] = ironicLike(ctx, r, img)
			results[c].done = time.Since(t0)
		})
	}
	wg.Wait()
	return results
}

func ironicLike(ctx context.Context, r *replica, img image) clientResult {
	var res clientResult
	url := r.clientURL + img.path()
	for res.tries = 1; ; res.tries++ {
		wait, err := ironicAttempt(ctx, r, url, img)
		if err == nil {
			res.err = nil
			return res
		}
		if res.firstFailure == "" {
			res.firstFailure = err.Error()
		}
		res.err = err
		if res.tries > clientRetries || ctx.Err() != nil {
			return res
		}
		select {
		case <-ctx.Done():
			return res
		case <-time.After(min(max(wait, time.Second), clientRetryAfter)):
		}
	}
}

// ironicAttempt is one HEAD, checksum, GET; on an answer that is not 200
// it says the Retry-After.
func ironicAttempt(ctx context.Context, r *replica, url string, img image) (time.Duration, error) {
	do := func(method, url string) (*http.Response, time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, method, url, nil)
		if err != nil {
			return nil, 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, 0, fmt.Errorf("%s %s: %w", method, r.id, err)
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			s, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			return nil, time.Duration(s) * time.Second, fmt.Errorf("%s from %s: %s", method, r.id, resp.Status)
		}
		return resp, 0, nil
	}
	resp, wait, err := do(http.MethodHead, url)
	if err != nil {
		return wait, err
	}
	resp.Body.Close()
	if resp.ContentLength != img.size {
		return 0, fmt.Errorf("HEAD from %s: Content-Length %d, want %d", r.id, resp.ContentLength, img.size)
	}
	if resp, wait, err = do(http.MethodGet, url+".sha256sum"); err != nil {
		return wait, fmt.Errorf("checksum file: %w", err)
	}
	sum, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if !strings.HasPrefix(string(sum), img.sha.String()+" ") {
		return 0, fmt.Errorf("checksum file from %s: %q", r.id, sum)
	}
	if resp, wait, err = do(http.MethodGet, url); err != nil {
		return wait, err
	}
	defer resp.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	r.served.Add(n)
	switch {
	case err != nil:
		return 0, fmt.Errorf("GET from %s after %d bytes: %w", r.id, n, err)
	case n != img.size || hex.EncodeToString(h.Sum(nil)) != img.sha.String():
		return 0, fmt.Errorf("GET from %s: %d bytes of sha256 %x, want %d of %s", r.id, n, h.Sum(nil), img.size, img.sha)
	}
	return 0, nil
}

// download reads url to the end and returns its length and sha256.
func download(ctx context.Context, url string) (int64, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	return n, hex.EncodeToString(h.Sum(nil)), err
}

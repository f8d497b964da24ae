package server

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// keepPartialDir leaves a checkpointed partial download of sha256 in the
// store of dir, as a server killed in the middle of it does.
func keepPartialDir(t *testing.T, dir string, sha256 osimage.SHA256) {
	t.Helper()
	store, err := imagestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	w, err := store.Resume(sha256)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("kept"))
	if err := w.Checkpoint("src", 4, sha256.String()); err != nil {
		t.Fatal(err)
	}
	if err := w.Suspend(); err != nil {
		t.Fatal(err)
	}
}

func partialExists(dir string, sha256 osimage.SHA256) bool {
	_, err := os.Stat(filepath.Join(dir, "partial", sha256.String()))
	return err == nil
}

// TestPartialsOfUnselectedImagesAreCollected: the partial download an
// earlier process kept for an image no longer selected is removed at the
// first garbage-collection pass once the desired set is known, not before;
// a failed download keeps its partial when the network failed, not when
// its bytes were refused.
func TestPartialsOfUnselectedImagesAreCollected(t *testing.T) {
	src := newFakeSource()
	gone := src.add("gone", []byte("an image no longer selected"), false)
	flaky := src.add("flaky", []byte("an image whose registry fails"), false)
	refused := src.add("refused", []byte("an image whose bytes are wrong"), false)
	src.fail[flaky.SHA256] = errors.New("GET: connection refused")
	src.fail[refused.SHA256] = &pull.VerifyError{What: pull.WhatSHA256, Expected: "x", Actual: "y"}
	dir := t.TempDir()
	for _, w := range []osimage.SHA256{gone.SHA256, flaky.SHA256, refused.SHA256} {
		keepPartialDir(t, dir, w)
	}
	h := start(t, dir, src, nil)
	h.srv.CollectGarbage()
	if !partialExists(dir, gone.SHA256) {
		t.Fatal("a partial was collected before the desired set was known")
	}
	h.want(flaky, refused)
	h.waitPhase(flaky.SHA256, PhaseFailed)
	h.waitPhase(refused.SHA256, PhaseFailed)
	h.srv.CollectGarbage()
	testenv.Eventually(t, "the unselected image's partial removed", 5*time.Second, func() (bool, string) {
		return !partialExists(dir, gone.SHA256), ""
	})
	if !partialExists(dir, flaky.SHA256) {
		t.Error("a download failed by the network lost its partial")
	}
	if partialExists(dir, refused.SHA256) {
		t.Error("a download whose bytes were refused kept its partial")
	}
}

// TestCheckingKeptBytesIsNotAStall: a download that continues bytes kept
// by an earlier attempt first reads them back from the disk, which for a
// large image on a slow volume outlasts --stall-timeout, with no network
// byte. Its signs of life (pull.Progress at the kept offset) keep the
// watchdog from cutting it, or from making it give way to a waiting image
// for a rate of 0; a check that shows no life is a stall.
func TestCheckingKeptBytesIsNotAStall(t *testing.T) {
	for _, alive := range []bool{true, false} {
		t.Run(map[bool]string{true: "alive", false: "hung"}[alive], func(t *testing.T) {
			src := newFakeSource()
			img := src.add("kept", []byte("an image continued from a partial download"), false)
			other := src.add("waiting", []byte("an image waiting for the slot"), false)
			pullKept := func(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress func(int64, int64)) (pull.Result, error) {
				if w.SHA256 != img.SHA256 {
					return src.pull(ctx, w, dst, progress)
				}
				progress(1000, 2000)
				for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); {
					select {
					case <-ctx.Done():
						return pull.Result{}, context.Cause(ctx)
					case <-time.After(50 * time.Millisecond):
					}
					if alive {
						progress(1000, 2000)
					}
				}
				return src.pull(ctx, w, dst, progress)
			}
			h := start(t, t.TempDir(), src, func(c *Config) {
				c.Pull = pullKept
				c.Concurrency = 1
				c.StallTimeout = 400 * time.Millisecond
				c.MinRate = 1 << 20
			})
			h.want(img, other)
			if alive {
				h.waitPhase(img.SHA256, PhaseReady)
				if st := h.status(img.SHA256); h.attempts(img.SHA256) != 0 || st.Reason != "" {
					t.Errorf("the check of the kept bytes was cut: %q", st.Reason)
				}
				return
			}
			testenv.Eventually(t, "the hung check cut as a stall", 5*time.Second, func() (bool, string) {
				st := h.status(img.SHA256)
				return strings.Contains(st.Reason, "stalled"), st.Reason
			})
		})
	}
}

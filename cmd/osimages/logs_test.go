package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/clip"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// An error that quotes a huge value is logged clipped: a selector pattern
// of 600 KB made a 1.2 MB ERROR line. The line keeps its beginning, which
// names the value, and says how long the error was.
func TestServeClipsLongLogLines(t *testing.T) {
	big := strings.Repeat("x", 600_000)
	mgmt := writeFile(t, "mgmt.yaml", "name: mgmt\nos_image_server_additional_selectors:\n  big: {os: '["+big+"'}\n")
	osImages := writeFile(t, "os-images.yaml", "os_images:\n  ubuntu: {uri: 'https://127.0.0.1:1/u.raw', sha256: '"+strings.Repeat("a", 64)+"', filename: u.raw, os: ubuntu}\n")
	out := filepath.Join(t.TempDir(), "served.yaml")
	d := startServe(t, freeAddr(t), "--data", t.TempDir(), "--os-images", osImages, "-f", mgmt, "--output-file", out)
	// The selection's problems are logged before the served set is
	// published.
	testenv.Eventually(t, "the served set published", 60*time.Second, func() (bool, string) {
		_, err := os.Stat(out)
		return err == nil, ""
	})
	d.kill(syscall.SIGTERM)
	logged := false
	sc := bufio.NewScanner(strings.NewReader(d.stderr.String()))
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if len(line) > 2*clip.LogValue {
			t.Errorf("a log line of %d bytes: %.300s…", len(line), line)
		}
		if strings.Contains(line, `"level":"ERROR","msg":"selection problems`) {
			logged = strings.Contains(line, ".os_image_server_additional_selectors.big: ") && strings.Contains(line, "[clipped: ")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !logged {
		t.Errorf("no clipped ERROR line naming the selector:\n%.2000s", d.stderr.String())
	}
}

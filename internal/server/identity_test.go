package server

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/capm3"
	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/values"
)

// The identity of an image (osimage: its sha256, its filename, the path
// that joins them) has one rule each, and the catalog, the image server
// and render apply the same: on every odd input below, all three accept it
// or all three refuse it. When they accept it, the URL render writes is
// one the server answers, with the image and a one-line .sha256sum.
func TestIdentityAgreesAcrossCatalogServerRender(t *testing.T) {
	content := []byte(strings.Repeat("identity", 512))
	h := sha256.Sum256(content)
	sum := hex.EncodeToString(h[:])
	id := osimage.SHA256(sum)
	tests := []struct {
		name, sha, filename string
		ok                  bool
	}{
		{"plain", sum, "ubuntu.raw", true},
		{"uppercase sha256", strings.ToUpper(sum), "ubuntu.raw", false},
		{"short sha256", sum[:63], "ubuntu.raw", false},
		{"backslash", sum, `a\b.raw`, false},
		{"percent", sum, "100%.raw", true},
		{"hash", sum, "a#1.raw", true},
		{"question mark", sum, "a?b=c.raw", true},
		{"space", sum, "my image.raw", true},
		{"non-ASCII", sum, "ubuntu-é-ß-日本.raw", true},
		{"plus and semicolon", sum, "a+b;c.raw", true},
		{"newline", sum, "a.raw\n" + sum + "  evil.raw", false},
		{"carriage return", sum, "a.raw\r", false},
		{"escape", sum, "a\x1b[31m.raw", false},
		{"NUL", sum, "a\x00.raw", false},
		{"slash", sum, "a/b.raw", false},
		{"dot dot", sum, "..", false},
		{"dot", sum, ".", false},
		{"hidden", sum, ".osimages.json", false},
		{"empty", sum, "", false},
		{"255 bytes", sum, strings.Repeat("a", 251) + ".raw", true},
		{"256 bytes", sum, strings.Repeat("a", 252) + ".raw", false},
		{"checksum suffix", sum, "a.raw.sha256sum", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			img := map[string]any{"uri": "https://files.example.org/x.raw", "sha256": tt.sha, "filename": tt.filename, "image-format": "raw"}

			_, err := catalog.PlanFromValues(values.Values{"os_images": map[string]any{"img": img}}, nil)
			var inputErr *catalog.InputError
			if err != nil && !errors.As(err, &inputErr) {
				t.Fatal(err)
			}
			catalogOK := err == nil

			cat := osimage.Catalog{"img": osimage.Image(img).Clone()}
			cluster := values.Values{
				"name": "c1", "k8s_version": "v1.32.5+rke2r1",
				"capi_providers": map[string]any{"infra_provider": "capm3", "bootstrap_provider": "cabpr"},
				"capm3":          map[string]any{"image_key": "img", "image_provisioning_host": "192.0.2.10"},
			}
			ts, renderErr := capm3.Render(capm3.Input{Values: cluster, Catalog: cat,
				Served: osimage.ServedSet{osimage.SHA256(tt.sha): {Available: true, ImageKey: "img"}}})
			renderOK := renderErr == nil

			mgmt := values.Values{servedset.AdditionalSelectorsKey: map[string]any{"it": map[string]any{"_os_images_key_": "img"}}}
			wanted, selErr := servedset.Select(mgmt, cat)
			serverOK := selErr == nil && len(wanted) == 1

			if catalogOK != tt.ok || renderOK != tt.ok || serverOK != tt.ok {
				t.Fatalf("accepted by catalog %v, render %v, server %v; want all %v\ncatalog: %v\nrender: %v\nserver: %v",
					catalogOK, renderOK, serverOK, tt.ok, err, renderErr, selErr)
			}
			if !tt.ok {
				return
			}

			image := ts[0].Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["image"].(map[string]any)
			u, err := url.Parse(image["url"].(string))
			if err != nil {
				t.Fatalf("render wrote %q: %v", image["url"], err)
			}
			if u.Path != "/images/"+sum+"/"+tt.filename || u.RawQuery != "" || u.Fragment != "" {
				t.Errorf("render's URL %s reads as path %q, query %q, fragment %q", u, u.Path, u.RawQuery, u.Fragment)
			}
			src := newFakeSource()
			src.content[id] = content
			hs := start(t, t.TempDir(), src, nil)
			hs.srv.SetDesired(wanted, nil)
			hs.waitPhase(id, PhaseReady)
			resp, body := hs.get(u.EscapedPath())
			if resp.StatusCode != http.StatusOK || string(body) != string(content) {
				t.Fatalf("GET %s (render's URL): %d, %d bytes", u.EscapedPath(), resp.StatusCode, len(body))
			}
			resp, body = hs.get(u.EscapedPath() + osimage.SHA256SumSuffix)
			if want := sum + "  " + tt.filename + "\n"; resp.StatusCode != http.StatusOK || string(body) != want {
				t.Errorf("GET %s.sha256sum: %d %q, want %q", u.EscapedPath(), resp.StatusCode, body, want)
			}
			// (HTML may write "+" as &#43;, which a browser reads back.)
			if _, page := hs.get("/"); !strings.Contains(html.UnescapeString(string(page)), fmt.Sprintf(`href="%s"`, u.EscapedPath())) {
				t.Errorf("the status page does not link to %s", u.EscapedPath())
			}
		})
	}
}

// The one path parser refuses what the builder cannot have built.
func TestImagePathRoundTrip(t *testing.T) {
	sha := osimage.SHA256(strings.Repeat("ab", 32))
	for _, name := range []string{"a.raw", "100%.raw", "a#b?c.raw", "é è.raw", "a+b.raw"} {
		p := osimage.ImagePath(sha, name)
		for _, suffix := range []string{"", osimage.SHA256SumSuffix, osimage.MD5SumSuffix} {
			f, ok := osimage.ParseImagePath(p + suffix)
			if !ok || f.SHA256 != sha || f.Filename != name || f.Checksum != suffix {
				t.Errorf("%q: parsed %+v %v", p+suffix, f, ok)
			}
		}
	}
	for _, p := range []string{
		"/images/" + string(sha) + "/a%2Fb.raw", "/images/" + strings.ToUpper(string(sha)) + "/a.raw",
		"/images/" + string(sha) + "/a/b.raw", "/images/" + string(sha) + "/", "/images/" + string(sha),
		"/x/images/" + string(sha) + "/a.raw", "/images/" + string(sha) + "/%zz.raw", "/images/" + string(sha) + "/..",
		"/images/" + string(sha) + "/a%0A.raw",
	} {
		if f, ok := osimage.ParseImagePath(p); ok {
			t.Errorf("%q parsed as %+v", p, f)
		}
	}
}

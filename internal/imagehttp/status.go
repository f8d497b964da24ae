package imagehttp

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"sync"
	"time"

	_ "embed"

	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/scrub"
	"github.com/sylva-projects/osimages/internal/serverio"
)

//go:embed status.html
var statusHTML string

// statusPage is parsed at the first request, not at package init: every
// command of the binary runs this package's init, and most never serve a
// page (the parse was 1,300 allocations of each start).
var statusPage = sync.OnceValue(func() *template.Template {
	return template.Must(template.New("status").Funcs(template.FuncMap{
		"bytes": osimage.FormatBytes,
		"percent": func(received, total int64) string {
			if total <= 0 {
				return ""
			}
			return fmt.Sprintf("%.0f%%", 100*float64(received)/float64(total))
		},
		"short": func(v fmt.Stringer) string {
			s := v.String()
			if len(s) > 12 {
				return s[:12]
			}
			return s
		},
		"join": strings.Join,
		"ago":  func(t time.Time) string { return time.Since(t).Round(time.Second).String() },

		// The link is the URL render writes, the filename escaped.
		"imagePath": osimage.ImagePath,
	}).Parse(statusHTML))
})

// ServerPhase is what the server as a whole is at, beside the phase of each
// image.
type ServerPhase string

const (
	// ServerStarting: the inputs are being read for the first time.
	ServerStarting ServerPhase = "starting"
	// ServerWaitingForCatalog: the catalog ConfigMap is absent or still
	// empty, as the chart creates it for the catalog Job to fill. A state
	// of a fresh install, not an error: the server is up (its status page,
	// health and metrics answer), selects nothing, and keeps the images it
	// has stored.
	ServerWaitingForCatalog ServerPhase = "waiting-for-catalog"
	// ServerServing: the catalog and values are loaded and the served set
	// is known.
	ServerServing ServerPhase = "serving"
)

var serverPhases = []ServerPhase{ServerStarting, ServerWaitingForCatalog, ServerServing}

// Condition says, the way Kubernetes conditions do, whether the server has
// loaded its catalog, and if not why.
type Condition struct {
	Type, Status, Reason, Message string
}

// CatalogLoadedCondition is the type of the server's Condition.
const CatalogLoadedCondition = "CatalogLoaded"

// ConditionOf is the CatalogLoaded condition of a server at phase;
// waiting is why it waits for its catalog.
func ConditionOf(phase ServerPhase, waiting string) Condition {
	c := Condition{Type: CatalogLoadedCondition, Status: "False"}
	switch phase {
	case ServerServing:
		c.Status, c.Reason, c.Message = "True", "Loaded", "the catalog and values are loaded"
	case ServerWaitingForCatalog:
		c.Reason, c.Message = "WaitingForCatalog", waiting
	default:
		c.Reason, c.Message = "Starting", "the inputs are being read"
	}
	return c
}

// Report is the image server's state, as the status page and the metrics
// show it.
type Report struct {
	Images      []Status
	SelectError error
	Ready       bool
	Phase       ServerPhase
	Condition   Condition
	Inputs      serverio.InputsStatus
	// Replicas and Leader: with replicas, every replica's images, this
	// one's first.
	Replicas []replica.State
	Leader   bool
	Scrub    scrub.Status
	// RefusedNeeds are the fleet's needs refused by policy.
	RefusedNeeds osimage.RefusedNeeds
	// LastCollection is when the last complete garbage collection began.
	LastCollection time.Time
	// Free is the free bytes of the data filesystem (FreeErr: unknown),
	// Used those of the stored images.
	Free    uint64
	FreeErr error
	Used    int64
}

// Status is one image as the status page and the metrics show it.
type Status struct {
	SHA256                osimage.SHA256
	Key, Filename, URI    string
	Phase                 imagelife.Phase
	Selected              bool
	Received, Total, Size int64
	Reason                string
	NextTry               time.Time
	DeselectedAt          time.Time
	// KeptBy names the objects that still reference a deselected image,
	// which is therefore kept and served.
	KeptBy []string
	// ReferencesUnknown: the image is deselected, and kept and served
	// until the Metal3 objects that may reference it are all known.
	ReferencesUnknown bool
	// Filenames are all the filenames the image is served under.
	Filenames []string
	// CheckedAt is when the stored file was last verified or scrubbed.
	CheckedAt time.Time
}

type statusView struct {
	Report
	SelectError string
	Counts      map[string]int
	Now         time.Time
}

// serveStatus renders the operators' page: every image with its state.
func (s Endpoints) serveStatus(w http.ResponseWriter, _ *http.Request) {
	view := statusView{Report: s.Images.Report(), Counts: map[string]int{}, Now: s.Now()}
	if view.Report.SelectError != nil {
		view.SelectError = view.Report.SelectError.Error()
	}
	for _, st := range view.Images {
		if st.Selected {
			view.Counts[string(st.Phase)]++
		}
	}
	// Rendered whole before the first byte: a template that fails answers
	// 500, never a 200 with half a page.
	var page bytes.Buffer
	if err := statusPage().Execute(&page, view); err != nil {
		s.Log.Error("rendering the status page failed", "error", err)
		http.Error(w, "the status page cannot be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(page.Bytes())
}

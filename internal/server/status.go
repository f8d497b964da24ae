package server

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"sync"
	"time"

	_ "embed"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
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

type statusView struct {
	Images      []Status
	SelectError string
	Ready       bool
	Phase       ServerPhase
	Condition   Condition
	Counts      map[string]int
	Now         time.Time
	Inputs      InputsStatus
	// Replicas and Leader: with Config.Replicas, every replica's images.
	Replicas []replica.State
	Leader   bool
	Scrub    ScrubStatus
	// RefusedNeeds are the fleet's needs refused by policy.
	RefusedNeeds osimage.RefusedNeeds
}

// serveStatus renders the operators' page: every image with its state.
func (s *Server) serveStatus(w http.ResponseWriter, _ *http.Request) {
	statuses, selErr := s.Statuses()
	view := statusView{Images: statuses, Ready: s.Ready(), Phase: s.Phase(), Condition: s.Condition(), Counts: map[string]int{}, Now: s.cfg.Now(), Inputs: s.InputsStatus(), Replicas: s.peerStatuses(), Leader: s.isLeader(), Scrub: s.ScrubStatus(), RefusedNeeds: s.RefusedNeeds()}
	if selErr != nil {
		view.SelectError = selErr.Error()
	}
	for _, st := range statuses {
		if st.Selected {
			view.Counts[string(st.Phase)]++
		}
	}
	// Rendered whole before the first byte: a template that fails answers
	// 500, never a 200 with half a page.
	var page bytes.Buffer
	if err := statusPage().Execute(&page, view); err != nil {
		s.log.Error("rendering the status page failed", "error", err)
		http.Error(w, "the status page cannot be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(page.Bytes())
}

package kube

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"

	"github.com/sylva-projects/osimages/internal/clip"
)

// MaxEventNote is the longest note the apiserver accepts in an event
// (events.k8s.io/v1): a longer one is refused, and the event lost.
const MaxEventNote = 1024

// BoundedEvents returns r with every note clipped to MaxEventNote bytes.
// Notes carry errors that quote tenant values and registry answers: an
// event about a long one must still reach its namespace.
func BoundedEvents(r events.EventRecorder) events.EventRecorder { return boundedEvents{r} }

type boundedEvents struct{ r events.EventRecorder }

func (b boundedEvents) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	b.r.Eventf(regarding, related, eventtype, reason, action, "%s", clip.String(fmt.Sprintf(note, args...), MaxEventNote))
}

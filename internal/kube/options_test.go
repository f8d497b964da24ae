package kube

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// namespace creates a namespace of the test's own, named by the
// apiserver from prefix, so that runs of a test (go test -count=N) never
// meet.
func namespace(t *testing.T, k *testenv.Kube, prefix string) string {
	t.Helper()
	ns, err := k.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func TestParseObjectKeyRefusesWhatTheApiserverRefuses(t *testing.T) {
	for _, c := range []struct {
		in   string
		says string
	}{
		{"Sylva-System/served", `namespace "Sylva-System"`},
		{"sylva.system/served", `namespace "sylva.system"`},
		{strings.Repeat("n", 64) + "/served", "must be no more than 63 characters"},
		{"ns/Served", `name "Served"`},
		{"ns/" + strings.Repeat("n", 254), "must be no more than 253 characters"},
		{"ns/-served", `name "-served"`},
	} {
		_, err := ParseObjectKey(c.in)
		if err == nil || !strings.Contains(err.Error(), "want NAMESPACE/NAME") || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%.40q: %v, want an error saying %s", c.in, err, c.says)
		}
	}
	// A name may hold dots (a DNS subdomain); a namespace may not.
	if k, err := ParseObjectKey("sylva-system/os-images.v1"); err != nil || k.Name != "os-images.v1" {
		t.Errorf("a dotted name: %v %v", k, err)
	}
}

func TestValidateListenAddress(t *testing.T) {
	for _, ok := range []string{":8080", "127.0.0.1:8080", "[::1]:0", "localhost:65535", ":0"} {
		if err := ValidateListenAddress(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"8080", "127.0.0.1", ":http", ":65536", ":-1", "[::1:80", ""} {
		err := ValidateListenAddress(bad)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("listen address %q: want [HOST]:PORT", bad)) {
			t.Errorf("%q: %v, want an error quoting it and asking for [HOST]:PORT", bad, err)
		}
	}
}

func TestQuantity(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{{"", 0}, {"0", 0}, {"500Gi", 500 << 30}, {"1k", 1000}, {"1Ki", 1024}, {"1.5Mi", 3 << 19}, {"42", 42}} {
		if got, err := Quantity("--max-size", c.in); err != nil || got != c.want {
			t.Errorf("%q: %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"500GB", "lots", "1 Gi"} {
		_, err := Quantity("--max-size", bad)
		if err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("--max-size %q: want a quantity such as 500Gi", bad)) {
			t.Errorf("%q: %v, want an error naming the flag and the value", bad, err)
		}
	}
}

func TestNewLoggerFormatAndVerbosity(t *testing.T) {
	if _, err := NewLogger(&strings.Builder{}, "yaml", 0); err == nil || err.Error() != `"yaml": want json or text` {
		t.Errorf("an unknown format: %v", err)
	}
	for _, c := range []struct {
		format    string
		verbosity int
		shown     []string
		hidden    []string
	}{
		{"json", 0, []string{`"msg":"info"`, `"msg":"error"`}, []string{"debug"}},
		{"json", 1, []string{`"msg":"info"`, `"msg":"debug"`}, []string{"trace"}},
		{"text", 2, []string{"msg=info", "msg=debug", "msg=trace"}, nil},
	} {
		var out strings.Builder
		log, err := NewLogger(&out, c.format, c.verbosity)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("info")
		log.V(1).Info("debug")
		log.V(2).Info("trace")
		log.Error(fmt.Errorf("boom"), "error")
		for _, s := range c.shown {
			if !strings.Contains(out.String(), s) {
				t.Errorf("%s at %d: %q not logged:\n%s", c.format, c.verbosity, s, out.String())
			}
		}
		for _, s := range c.hidden {
			if strings.Contains(out.String(), s) {
				t.Errorf("%s at %d: %q logged:\n%s", c.format, c.verbosity, s, out.String())
			}
		}
	}
}

// recorder records the notes of the events it is given.
type recorder struct{ notes []string }

func (r *recorder) Eventf(_, _ runtime.Object, _, _, _, note string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(note, args...))
}

// An event's note is formatted once, then clipped to what the apiserver
// accepts; a % in a tenant's value is not read as a verb again.
func TestBoundedEvents(t *testing.T) {
	r := &recorder{}
	b := BoundedEvents(r)
	b.Eventf(nil, nil, corev1.EventTypeWarning, "Refused", "Check", "image %s: %s", "ubuntu", "short")
	b.Eventf(nil, nil, corev1.EventTypeWarning, "Refused", "Check", "values: %s", "100%s "+strings.Repeat("x", 5000))
	if len(r.notes) != 2 {
		t.Fatalf("%d events, want 2", len(r.notes))
	}
	if r.notes[0] != "image ubuntu: short" {
		t.Errorf("short note %q", r.notes[0])
	}
	long := r.notes[1]
	if len(long) > MaxEventNote || !strings.HasPrefix(long, "values: 100%s xxx") || !strings.Contains(long, "[clipped: 5014 bytes in all]") {
		t.Errorf("long note of %d bytes: %.80q ... %q", len(long), long, long[max(0, len(long)-40):])
	}
}

func TestHealthEnabled(t *testing.T) {
	for addr, want := range map[string]bool{"": false, "0": false, ":8081": true, "127.0.0.1:0": true} {
		if got := (ManagerOptions{HealthAddr: addr}).HealthEnabled(); got != want {
			t.Errorf("%q: %v, want %v", addr, got, want)
		}
	}
}

// TestManagerLeaseAndHealth: a manager of these options takes the Lease
// of its default name when none is given, serves its health endpoints
// when asked, and releases the Lease when it stops, so that another
// replica takes over at once instead of after the lease duration.
func TestManagerLeaseAndHealth(t *testing.T) {
	k := suite.Kube(t)
	ns := namespace(t, k, "kube-lease")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	health := ln.Addr().String()
	ln.Close()
	o := ManagerOptions{
		LeaderElection: true, LeaderElectionNamespace: ns,
		LeaseDuration: time.Hour, RenewDeadline: 50 * time.Minute, RetryPeriod: time.Second,
		HealthAddr: health,
	}
	mgr, err := o.NewManager(k.Config, cache.Options{}, "osimages-test")
	if err != nil {
		t.Fatal(err)
	}
	stop := testenv.StartManager(t, mgr)
	select {
	case <-mgr.Elected():
	case <-time.After(time.Minute):
		t.Fatal("not elected")
	}
	ctx := context.Background()
	lease, err := k.Client.CoordinationV1().Leases(ns).Get(ctx, "osimages-test", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Lease of the default name: %v", err)
	}
	if holder(lease) == "" {
		t.Errorf("the Lease has no holder: %+v", lease.Spec)
	}
	testenv.Succeeds(t, "the health endpoint", time.Minute, func() error {
		resp, err := http.Get("http://" + health + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/healthz: %s", resp.Status)
		}
		return nil
	})

	stop()
	// Released: no holder, though an hour of lease was left.
	lease, err = k.Client.CoordinationV1().Leases(ns).Get(ctx, "osimages-test", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := holder(lease); h != "" {
		t.Errorf("the stopped manager still holds the Lease: %q", h)
	}
}

func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

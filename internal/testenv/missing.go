package testenv

import (
	"fmt"
	"os"
	"testing"
)

// RequireAllEnv names the switch that turns every skip for a missing tool or
// fixture into a failure. CI sets it (.ci/run): there, the tests with real
// clients (Ironic, IPA, oras, cosign, the Sylva library, the Metal3 CRDs) are
// the only proof that what osimages serves is accepted, and a skip would let
// a run pass without them.
const RequireAllEnv = "OSIMAGES_REQUIRE_ALL"

// Required reports whether RequireAllEnv is set.
func Required() bool { return os.Getenv(RequireAllEnv) != "" }

// MissingMark ends the reason of every skip Missing makes, so that the
// report of a run (hack/testreport, which holds the same text) tells these
// skips from those for a platform or a privilege, and fails a run with
// RequireAllEnv set that has any.
const MissingMark = "[missing: " + RequireAllEnv + " makes this skip a failure]"

// Missing ends a test that cannot run because a tool or fixture is absent:
// a skip that says why, or, when RequireAllEnv is set, a failure that says
// so. Skips for other reasons (a platform, a privilege) stay t.Skip, each
// listed with its reason in TestSkipsForAMissingToolGoThroughMissing.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if Required() {
		t.Fatalf("%s, and %s is set: every real-component test must run here (hack/tools.sh installs the tools; shared/ holds the fixtures)", why, RequireAllEnv)
	}
	t.Skip(why + " " + MissingMark)
}

package propagate

import (
	"os"
	"testing"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// suite is the apiserver the tests of the package share. Each test works
// with rules, label keys and namespaces of its own, so that tests do not
// see each other's objects.
var suite = testenv.NewSuite(nil)

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

package server

import (
	"os"
	"testing"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// suite is the package's apiserver, started by the first test that needs
// one and shared by the others.
var suite = testenv.NewSuite(nil)

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

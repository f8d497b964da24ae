package controller

import (
	"os"
	"testing"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// suite is the apiserver the tests of the package share, with the Metal3
// CRDs; each test works in namespaces and with labels of its own.
var suite = testenv.NewSuite(testenv.WithMetal3CRDs)

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

package oci

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// NewClients builds the pair from one set of options: the insecure switch
// is the only difference, and a bad option fails both.
func TestNewClients(t *testing.T) {
	c, err := NewClients(Options{Insecure: true, RegistryConfig: writeConfig(t)})
	if err != nil {
		t.Fatal(err)
	}
	if c.Secure.insecure || !c.Insecure.insecure {
		t.Errorf("clients: secure %v, insecure %v", c.Secure.insecure, c.Insecure.insecure)
	}
	if _, err := NewClients(Options{CAFile: filepath.Join(t.TempDir(), "missing.pem")}); err == nil || !strings.Contains(err.Error(), "reading CA file") {
		t.Errorf("missing CA file: %v", err)
	}
}

func writeConfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(`{"auths": {}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

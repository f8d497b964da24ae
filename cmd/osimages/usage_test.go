package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCommandLineErrorsExit2 holds every class of command-line error, of
// every command, to the README's promise: exit 2 (the input is wrong), a
// message naming the flag, the argument or the command, and nothing on
// standard output. None of them reaches a cluster or a registry: the
// kubeconfig names a port where nothing listens, so a check made after
// connecting would fail with another message.
func TestCommandLineErrorsExit2(t *testing.T) {
	values := writeFile(t, "values.yaml", "name: x\n")
	kubeconfig := writeFile(t, "kubeconfig", `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`)
	data := t.TempDir()
	serve := func(args ...string) []string {
		return append([]string{"serve", "--data", data, "-f", values, "--os-images", values}, args...)
	}
	output := filepath.Join(t.TempDir(), "served.yaml")
	manager := func(cmd string, args ...string) []string {
		return append([]string{cmd, "--kubeconfig", kubeconfig}, args...)
	}
	plan := func(args ...string) []string {
		return append([]string{"plan", "-f", values, "--kubeconfig", kubeconfig}, args...)
	}
	for _, tc := range []struct {
		class string
		args  []string
		want  string
	}{
		// What cobra refuses.
		{"unknown command", []string{"rendr"}, `unknown command "rendr" for "osimages"; did you mean render?`},
		{"unknown flag", []string{"render", "--bogus"}, "unknown flag: --bogus (see 'osimages render --help')"},
		{"unknown shorthand", []string{"catalog", "-Z"}, "unknown shorthand flag: 'Z' in -Z"},
		{"missing value", []string{"render", "-f"}, "flag needs an argument: 'f' in -f"},
		{"unparsable int", []string{"serve", "--concurrency", "x"}, `invalid argument "x" for "--concurrency" flag`},
		{"unparsable duration", []string{"controller", "--resync", "soon"}, `invalid argument "soon" for "--resync" flag`},
		{"unparsable bool", []string{"catalog", "-f", values, "--apply=maybe"}, `invalid argument "maybe" for "--apply" flag`},
		{"extra argument", []string{"select", "extra"}, `unknown command "extra" for "osimages select"`},
		{"extra argument to a flagged command", []string{"render", "-f", values, "extra"}, `unknown command "extra" for "osimages render"`},
		{"missing required flag", []string{"catalog"}, `required flag(s) "values" not set (see 'osimages catalog --help')`},
		{"missing required flags", []string{"serve"}, `required flag(s) "data", "values" not set`},
		// Values that parse but are wrong, each checked before any
		// connection.
		{"render API version", []string{"render", "-f", values, "--api-version", "v9"}, `--api-version: API version "v9"`},
		{"render ConfigMap", []string{"render", "-f", values, "--served-configmap", "bad"}, `--served-configmap "bad": want NAMESPACE/NAME`},
		{"render namespace", []string{"render", "-f", values, "-n", "Bad_NS"}, `--namespace: namespace "Bad_NS"`},
		{"catalog timeout", []string{"catalog", "-f", values, "--timeout", "-1s"}, "--timeout -1s: give a positive duration"},
		{"catalog namespace", []string{"catalog", "-f", values, "-n", "kube_system"}, `--namespace: namespace "kube_system"`},
		{"serve scrub interval", serve("--output-file", output, "--scrub-interval", "1ns"), "--scrub-interval 1ns is below the minimum of 1m0s"},
		{"serve ConfigMap", serve("--output-configmap", "ns/Bad_Name"), `--output-configmap "ns/Bad_Name": want NAMESPACE/NAME: name "Bad_Name"`},
		{"serve fleet prefix without the switch", serve("--output-file", output, "--fleet-needs-allow-prefix", "ftp://x/"), `--fleet-needs-allow-prefix "ftp://x/"`},
		{"controller address", manager("controller", "--metrics-addr", "bad:addr:1"), `--metrics-addr: listen address "bad:addr:1"`},
		{"controller copy name", manager("controller", "--served-copy", "Bad Name"), `--served-copy: name "Bad Name"`},
		{"controller Lease name", manager("controller", "--leader-election-id", "Bad Name"), `--leader-election-id: name "Bad Name"`},
		{"controller fleet needs", manager("controller", "--fleet-needs", "a/B"), `--fleet-needs "a/B": want NAMESPACE/NAME`},
		{"propagate Lease namespace", manager("propagate", "--leader-election-namespace", "X"), `--leader-election-namespace: namespace "X"`},
		{"propagate workers", manager("propagate", "--workers", "0"), "--workers 0: must be at least 1"},
		{"plan timeout", plan("--timeout", "0s"), "--timeout 0s: give a positive duration"},
		{"plan ConfigMap", plan("--served-configmap", "bad"), `--served-configmap "bad": want NAMESPACE/NAME`},
		{"plan quota", plan("--fleet-needs-max-bytes-per-namespace", "lots"), `--fleet-needs-max-bytes-per-namespace "lots"`},
	} {
		t.Run(tc.class, func(t *testing.T) {
			// A command that accepted a wrong flag and went on to serve is
			// stopped after a minute, and fails the test.
			r := runFor(t, time.Minute, tc.args...)
			if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("osimages %s: exit %d, stdout %q, stderr %q; want exit 2, nothing printed and %q",
					strings.Join(tc.args, " "), r.code, r.stdout, r.stderr, tc.want)
			}
		})
	}
	// No command is not an error: it prints the help.
	if r := run(t); r.code != 0 || !strings.Contains(r.stdout, "Available Commands:") {
		t.Errorf("osimages alone: exit %d, stdout %q, stderr %q; want the help", r.code, r.stdout, r.stderr)
	}
}

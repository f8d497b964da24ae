package main

import (
	"strings"
	"testing"
)

// controller and propagate share one set of manager flags, validated the
// same way: the controller used not to check the apiserver rate at all.
func TestManagerCommandsRefuseBadAPIRate(t *testing.T) {
	for _, command := range []string{"controller", "propagate"} {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--kube-api-qps", "0"}, "--kube-api-qps 0 and --kube-api-burst 500: must be positive"},
			{[]string{"--kube-api-qps", "-5"}, "--kube-api-qps -5 and --kube-api-burst 500: must be positive"},
			{[]string{"--kube-api-burst", "0"}, "--kube-api-qps 200 and --kube-api-burst 0: must be positive"},
			{[]string{"--log-format", "xml"}, `--log-format "xml": want json or text`},
		} {
			// A kubeconfig that cannot be read: the flags must be refused
			// before the cluster is looked for.
			r := run(t, append([]string{command, "--kubeconfig", "/nonexistent"}, tc.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("%s %v: exit %d, stderr %q; want exit 2 saying %q", command, tc.args, r.code, r.stderr, tc.want)
			}
		}
	}
}

package propagate

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/kube"
)

// CommandOptions are those of `osimages propagate`, as its flags give
// them. Errors name the flags.
type CommandOptions struct {
	Manager kube.ManagerFlags
	// Config is the rules file; "" is Sylva's one rule.
	Config  string
	Adopt   bool
	Resync  time.Duration
	Workers int
}

// RunCommand checks o, then propagates until ctx ends, logging to stderr.
// Wrong flags or rules are an exitcode.InputError, a controller that
// fails an exitcode.FailureError.
func RunCommand(ctx context.Context, o CommandOptions, stderr io.Writer) error {
	if o.Workers < 1 {
		return exitcode.InputError(fmt.Errorf("--workers %d: must be at least 1", o.Workers))
	}
	if o.Resync <= 0 {
		return exitcode.InputError(fmt.Errorf("--resync %s: must be positive", o.Resync))
	}
	if err := o.Manager.Validate(); err != nil {
		return exitcode.InputError(err)
	}
	rules, err := LoadRulesOrDefault(o.Config)
	if err != nil {
		return exitcode.InputError(err)
	}
	cfg, mgr, err := o.Manager.Setup(stderr, "")
	if err != nil {
		return exitcode.InputError(err)
	}
	for _, r := range rules {
		mgr.Logger.Info("rule", "name", r.Name, "source", r.Source.String(), "target", r.Target, "namespaceSelector", r.Selector.String())
	}
	opts := Options{Rules: rules, Adopt: o.Adopt, Resync: o.Resync, Workers: o.Workers, ManagerOptions: mgr}
	return exitcode.FailureError(Run(ctx, cfg, opts))
}

// LoadRulesOrDefault reads the rules file path, or returns Sylva's one
// rule when path is "".
func LoadRulesOrDefault(path string) ([]Rule, error) {
	if path == "" {
		return DefaultRules(), nil
	}
	return LoadRules(path)
}

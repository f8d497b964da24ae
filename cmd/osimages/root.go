package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/exitcode"
)

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "osimages",
		Short: "Resolve, serve and render the OS images of Metal3 bare-metal clusters",
		Long: `osimages manages the operating-system images that bare-metal Kubernetes
nodes boot from, for fleets of Cluster API Provider Metal3 clusters built with
Sylva: it resolves image catalogs from OCI registries, serves verified images
to Ironic, propagates what is served, and renders Metal3MachineTemplates.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// cobra's own default, which only its own refusal sets.
		SuggestionsMinimumDistance: 2,
		// Without a command, the help; with an unknown one, an input error
		// (cobra's own would exit 1).
		Args: unknownCommand,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.AddCommand(newCatalogCommand(), newSelectCommand(), newRenderCommand(), newServeCommand(), newPropagateCommand(),
		newControllerCommand(), newPlanCommand(), newDemoCommand())
	return root
}

// flagErrorsAreInputErrors makes every error of the command line itself
// (unknown flag or command, missing or unparsable value, extra argument,
// missing required flag) exit 2, as any other input error, naming the help
// to read. cobra returns them as plain errors, which would exit 1. It is
// called on the whole tree, cobra's help and completion commands included.
func flagErrorsAreInputErrors(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usageError(cmd, err) })
	// cobra checks required flags and flag groups after the pre-run hooks:
	// checking them here first gives them the code of input errors. No
	// command has a pre-run hook of its own that this would shadow.
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if err := cmd.ValidateRequiredFlags(); err != nil {
			return usageError(cmd, err)
		}
		if err := cmd.ValidateFlagGroups(); err != nil {
			return usageError(cmd, err)
		}
		return nil
	}
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		if args := cmd.Args; args != nil {
			cmd.Args = func(c *cobra.Command, a []string) error {
				if err := args(c, a); err != nil {
					return usageError(c, err)
				}
				return nil
			}
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// unknownCommand refuses any argument of the root command: it is the name
// of no command.
func unknownCommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return errors.New(msg)
}

func usageError(cmd *cobra.Command, err error) error {
	if err == nil {
		return nil
	}
	return exitcode.InputError(fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath()))
}

package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestServe(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		validErr error
		runErr   error
		code     int
		output   string // in what the command printed
		ran      bool
	}{
		{name: "runs", args: []string{"--x=1", "--v=3"}, code: 0, ran: true},
		{name: "run fails", args: nil, runErr: errors.New("boom"), code: 1, ran: true},
		{name: "unknown flag", args: []string{"--nope"}, code: 2, output: "flag provided but not defined: -nope"},
		{name: "positional argument", args: []string{"extra"}, code: 2, output: `demo: unexpected argument "extra"`},
		{name: "invalid", args: nil, validErr: errors.New("--x must be 2"), code: 2, output: "demo: --x must be 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			fs := flag.NewFlagSet("demo", flag.ContinueOnError)
			fs.SetOutput(&out)
			fs.Int("x", 0, "a flag")
			ran := false
			code := Serve(context.Background(), fs, tc.args, "verbosity",
				func() error { return tc.validErr },
				func(context.Context) error { ran = true; return tc.runErr })
			if code != tc.code || ran != tc.ran {
				t.Errorf("code %d, ran %v; want %d, %v", code, ran, tc.code, tc.ran)
			}
			if !strings.Contains(out.String(), tc.output) {
				t.Errorf("output %q, want %q in it", out.String(), tc.output)
			}
			if fs.Lookup("v") == nil {
				t.Error("no --v flag")
			}
		})
	}
}

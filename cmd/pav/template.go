package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/internal/templating"
)

// runTemplate is `pav template`: every string of one YAML document is evaluated
// as a template with the variables of --vars, and the result printed as JSON. On
// error: status 1, the error on stderr, nothing on stdout.
func runTemplate(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pav template", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: pav template [FILE|-] [--vars FILE]\n\nEvaluates every string of a YAML or JSON document as a pav (Jinja) template and prints the result as JSON.")
		fs.PrintDefaults()
	}
	varsFile := fs.String("vars", "", "YAML or JSON file with the template variables (a mapping); default: none")
	if err := parseInterspersed(fs, args); err != nil {
		return 2
	}
	if fs.NArg() > 1 {
		fmt.Fprintln(stderr, "pav template: give one input file (or - for stdin)")
		return 2
	}
	out, err := evalTemplateDoc(ctx, fs.Arg(0), *varsFile, stdin)
	if err != nil {
		fmt.Fprintf(stderr, "pav template: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, string(out))
	return 0
}

func evalTemplateDoc(ctx context.Context, input, varsFile string, stdin io.Reader) ([]byte, error) {
	doc, err := readInput(input, stdin)
	if err != nil {
		return nil, err
	}
	var value any
	if err := yaml.Unmarshal(doc, &value); err != nil {
		return nil, fmt.Errorf("input is not YAML: %w", err)
	}
	vars := templating.Vars{}
	if varsFile != "" {
		b, err := os.ReadFile(varsFile)
		if err != nil {
			return nil, fmt.Errorf("--vars: %w", err)
		}
		v, err := templating.ParseYAML(string(b))
		if err != nil {
			return nil, fmt.Errorf("--vars %s is not YAML: %w", varsFile, err)
		}
		switch m := v.(type) {
		case map[string]any:
			vars = m
		case nil:
		default:
			return nil, fmt.Errorf("--vars %s must hold a mapping of variable names to values", varsFile)
		}
	}
	engine := templating.New(templating.Options{})
	result, err := engine.Evaluate(ctx, templating.Normalize(value), "", vars)
	if err != nil {
		return nil, err
	}
	return json.Marshal(result)
}

func readInput(name string, stdin io.Reader) ([]byte, error) {
	if name == "" || name == "-" {
		return io.ReadAll(stdin)
	}
	return os.ReadFile(name)
}

// parseInterspersed lets flags come after positional arguments
// (`pav template in.yaml --vars v.yaml`), which the flag package alone stops at.
func parseInterspersed(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
	return fs.Parse(pos) // leaves pos as fs.Args(); pos holds no flags
}

package capm3

import (
	"bytes"
	"fmt"

	"sigs.k8s.io/yaml"
)

// MarshalYAML renders templates as one multi-document YAML stream, in the
// order given, each document starting with "---". sigs.k8s.io/yaml writes
// keys sorted, so equal templates give equal bytes.
func MarshalYAML(templates []Template) ([]byte, error) {
	var buf bytes.Buffer
	for _, t := range templates {
		doc, err := yaml.Marshal(t.Object)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.Level, err)
		}
		buf.WriteString("---\n")
		buf.Write(doc)
	}
	return buf.Bytes(), nil
}

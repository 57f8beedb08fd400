package vectors

import (
	"bytes"
	_ "embed"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// SchemaName is the project schema's file name under schema/, and the value of a project file's
// "schema" field (Wycheproof's convention).
const SchemaName = "kvexact_vectors_v1.schema.json"

//go:embed schema/kvexact_vectors_v1.schema.json
var schemaJSON []byte

var compiled = sync.OnceValues(func() (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schemaJSON))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource(SchemaName, doc); err != nil {
		return nil, err
	}
	return c.Compile(SchemaName)
})

// validateProject checks a decoded project file against the JSON Schema. The error names the JSON
// path of the first offending value (the deepest cause) and what the schema wanted.
func validateProject(name string, doc any) error {
	sch, err := compiled()
	if err != nil {
		return fmt.Errorf("vectors: schema/%s does not compile: %w", SchemaName, err)
	}
	err = sch.Validate(doc)
	if err == nil {
		return nil
	}
	ve, ok := err.(*jsonschema.ValidationError)
	if !ok {
		return &PathError{File: name, Path: "$", Err: err}
	}
	leaf := ve
	for len(leaf.Causes) > 0 {
		leaf = leaf.Causes[0]
	}
	return &PathError{File: name, Path: jsonPath(leaf.InstanceLocation), Err: fmt.Errorf("does not match %s: %s", SchemaName, leaf.ErrorKind.LocalizedString(message.NewPrinter(language.English)))}
}

// jsonPath renders an instance location as $.a.b[3].
func jsonPath(loc []string) string {
	var sb strings.Builder
	sb.WriteByte('$')
	for _, t := range loc {
		if t != "" && strings.Trim(t, "0123456789") == "" {
			fmt.Fprintf(&sb, "[%s]", t)
		} else {
			sb.WriteString("." + t)
		}
	}
	return sb.String()
}

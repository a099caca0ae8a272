package fenceprom_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leasefence/leasefence/fence/fenceprom"
)

// Every series a Metrics collects is named in the package doc and in
// docs/operations.md, so that an operator reading either finds it.
func TestEverySeriesDocumented(t *testing.T) {
	m, err := fenceprom.New()
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc, 64)
	m.Describe(ch)
	close(ch)
	name := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	var series []string
	for d := range ch {
		if s := name.FindStringSubmatch(d.String()); s != nil {
			series = append(series, s[1])
		}
	}
	if len(series) < 10 {
		t.Fatalf("found %d series, want at least 10: %v", len(series), series)
	}
	for _, doc := range []string{"doc.go", filepath.Join("..", "..", "docs", "operations.md")} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range series {
			if !strings.Contains(string(b), s) {
				t.Errorf("%s does not name the series %s", doc, s)
			}
		}
	}
}

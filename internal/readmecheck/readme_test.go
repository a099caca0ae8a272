package readmecheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// normalize drops indentation and blank lines, so that a sample matches the
// example it was copied from whatever its nesting there.
func normalize(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

func TestReadmeSamplesAreExamples(t *testing.T) {
	root := filepath.Join("..", "..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var examples []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == "example_test.go" {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			examples = append(examples, normalize(string(b)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	samples := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(samples) == 0 {
		t.Fatal("no Go samples found in the README")
	}
	for _, m := range samples {
		sample := normalize(m[1])
		found := false
		for _, ex := range examples {
			if strings.Contains(ex, sample) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("README sample is not in any example_test.go, so nothing compiles it:\n%s", m[1])
		}
	}
}

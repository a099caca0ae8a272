package readmecheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
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

// goFence matches a fenced Go block: an opening fence of "go" or "golang"
// (any case, any indentation, an info string after it allowed), its body,
// and the closing fence.
var goFence = regexp.MustCompile("(?ms)^[ \t]*```[ \t]*(?i:go|golang)(?:[ \t][^\n]*)?\r?\n(.*?)^[ \t]*```")

// goSamples returns the bodies of the fenced Go blocks of a Markdown text.
func goSamples(markdown string) []string {
	var out []string
	for _, m := range goFence.FindAllStringSubmatch(markdown, -1) {
		out = append(out, m[1])
	}
	return out
}

// uncompiled returns the samples that are in none of the examples (each
// already normalized).
func uncompiled(samples, examples []string) []string {
	var out []string
	for _, s := range samples {
		n := normalize(s)
		if !slices.ContainsFunc(examples, func(ex string) bool { return strings.Contains(ex, n) }) {
			out = append(out, s)
		}
	}
	return out
}

// examples reads every example_test.go under root, normalized.
func examples(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Name() == "example_test.go" {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			out = append(out, normalize(string(b)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no example_test.go found")
	}
	return out
}

// TestDocSamplesAreExamples checks every Go sample of README.md,
// CONTRIBUTING.md and docs/*.md. Only the README must have some.
func TestDocSamplesAreExamples(t *testing.T) {
	root := filepath.Join("..", "..")
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []struct {
		path        string
		needSamples bool
	}{
		{"README.md", true},
		{"CONTRIBUTING.md", false},
	}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, struct {
			path        string
			needSamples bool
		}{filepath.ToSlash(rel), false})
	}
	exs := examples(t, root)
	for _, f := range files {
		t.Run(f.path, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f.path)))
			if err != nil {
				t.Fatal(err)
			}
			samples := goSamples(string(b))
			if f.needSamples && len(samples) == 0 {
				t.Fatalf("no Go samples found in %s", f.path)
			}
			for _, s := range uncompiled(samples, exs) {
				t.Errorf("%s: Go sample is not in any example_test.go, so nothing compiles it (copy it from one, or mark it ```text):\n%s", f.path, s)
			}
		})
	}
}

// TestCheckCanFail runs the check on a synthetic document: a sample that
// no example holds is reported, one copied from an example (indented
// differently) is not, and blocks of other languages are not samples.
func TestCheckCanFail(t *testing.T) {
	exs := []string{normalize("package x\n\nfunc Example() {\n\tfmt.Println(\"held\")\n\tl.Unlock()\n}\n")}
	doc := "# Title\n\n```go\nfmt.Println(\"held\")\n    l.Unlock()\n```\n\n" +
		"- item:\n\n  ```Go\n  fmt.Println(\"not in any example\")\n  ```\n\n" +
		"```golang title\nl.Lock()\n```\n\n" +
		"```text\nnot Go at all\n```\n\n```sh\ngo test ./...\n```\n"
	samples := goSamples(doc)
	if len(samples) != 3 {
		t.Fatalf("found %d Go samples, want 3: %q", len(samples), samples)
	}
	got := uncompiled(samples, exs)
	want := []string{"  fmt.Println(\"not in any example\")\n", "l.Lock()\n"}
	if !slices.Equal(got, want) {
		t.Errorf("uncompiled samples %q, want %q", got, want)
	}
	if got := goSamples("no code here\n"); len(got) != 0 {
		t.Errorf("samples in a text without code: %q", got)
	}
}

// The README says what a user needs to start; the rest lives in docs/.
func TestReadmeIsShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 250 {
		t.Fatalf("README.md has %d lines, at most 250: move details to docs/", n)
	}
}

package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// finding is an unexported name found in a doc comment.
type finding struct {
	pos  string // where the comment is
	doc  string // whose doc it is: "package", or the declaration's name
	name string // the unexported name it contains
}

// unexportedNames returns a package's unexported identifiers: top-level
// functions, types, variables and constants, methods, and the fields of its
// exported struct types.
func unexportedNames(files []*ast.File) map[string]bool {
	names := map[string]bool{}
	add := func(id *ast.Ident) {
		if id != nil && id.Name != "_" && !id.IsExported() {
			names[id.Name] = true
		}
	}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				add(d.Name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						add(s.Name)
						if !s.Name.IsExported() {
							continue
						}
						switch t := s.Type.(type) {
						case *ast.StructType:
							for _, fl := range t.Fields.List {
								for _, n := range fl.Names {
									add(n)
								}
							}
						case *ast.InterfaceType:
							for _, m := range t.Methods.List {
								for _, n := range m.Names {
									add(n)
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							add(n)
						}
					}
				}
			}
		}
	}
	return names
}

// exportedNames returns a package's exported top-level names, the
// qualifiers of the Exported.name form.
func exportedNames(files []*ast.File) map[string]bool {
	names := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					names[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names[s.Name.Name] = true
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names[n.Name] = true
							}
						}
					}
				}
			}
		}
	}
	return names
}

// docComment is a doc comment a reader of the documentation sees.
type docComment struct {
	owner  string
	group  *ast.CommentGroup
	params map[string]bool // a function's parameter and result names
}

// paramNames returns the names of a function's parameters and results,
// which its doc may name (Go's convention) even if a field shares one.
func paramNames(d *ast.FuncDecl) map[string]bool {
	names := map[string]bool{}
	for _, l := range []*ast.FieldList{d.Type.Params, d.Type.Results} {
		if l == nil {
			continue
		}
		for _, f := range l.List {
			for _, n := range f.Names {
				names[n.Name] = true
			}
		}
	}
	return names
}

// recvType returns the name of a method's receiver type.
func recvType(d *ast.FuncDecl) string {
	t := d.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// visibleDocs returns the package doc and the doc comments of exported
// declarations, with those of the exported fields and methods of exported
// types.
func visibleDocs(files []*ast.File) []docComment {
	var out []docComment
	add := func(owner string, g *ast.CommentGroup) {
		if g != nil {
			out = append(out, docComment{owner: owner, group: g})
		}
	}
	addFunc := func(owner string, d *ast.FuncDecl) {
		if d.Doc != nil {
			out = append(out, docComment{owner, d.Doc, paramNames(d)})
		}
	}
	for _, f := range files {
		add("package "+f.Name.Name, f.Doc)
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					addFunc(d.Name.Name, d)
				} else if r := recvType(d); token.IsExported(r) {
					addFunc(r+"."+d.Name.Name, d)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						add(s.Name.Name, d.Doc)
						add(s.Name.Name, s.Doc)
						var fields *ast.FieldList
						switch t := s.Type.(type) {
						case *ast.StructType:
							fields = t.Fields
						case *ast.InterfaceType:
							fields = t.Methods
						}
						if fields == nil {
							continue
						}
						for _, fl := range fields.List {
							for _, n := range fl.Names {
								if n.IsExported() {
									add(s.Name.Name+"."+n.Name, fl.Doc)
									add(s.Name.Name+"."+n.Name, fl.Comment)
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								add(n.Name, d.Doc)
								add(n.Name, s.Doc)
								add(n.Name, s.Comment)
								break
							}
						}
					}
				}
			}
		}
	}
	return out
}

func isIdent(b byte) bool {
	return b == '_' || '0' <= b && b <= '9' || 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z'
}

// codeLike reports whether a name is spelled like code wherever it
// appears: with an uppercase letter or an underscore.
func codeLike(name string) bool {
	return strings.ContainsAny(name, "_ABCDEFGHIJKLMNOPQRSTUVWXYZ")
}

// names returns the unexported names a text contains (see the package doc
// for the rule), sorted and without repeats.
func names(text string, unexported, exported map[string]bool) []string {
	var out []string
	for i := 0; i < len(text); {
		if !isIdent(text[i]) {
			i++
			continue
		}
		j := i
		for j < len(text) && isIdent(text[j]) {
			j++
		}
		w := text[i:j]
		if unexported[w] && !(i > 0 && text[i-1] == '.' && !qualified(text[:i-1], exported)) {
			before, after := byte(0), byte(0)
			if i > 0 {
				before = text[i-1]
			}
			if j < len(text) {
				after = text[j]
			}
			switch {
			case codeLike(w),
				before == '`' && after == '`',
				after == '(',
				before == '.':
				out = append(out, w)
			}
		}
		i = j
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// qualified reports whether text ends in an exported name of the package,
// so that a name after it and a dot is a selector (Lock.name).
func qualified(text string, exported map[string]bool) bool {
	i := len(text)
	for i > 0 && isIdent(text[i-1]) {
		i--
	}
	return exported[text[i:]]
}

// check returns the unexported names in the visible doc comments of one
// package's files.
func check(fset *token.FileSet, files []*ast.File) []finding {
	unexported, exported := unexportedNames(files), exportedNames(files)
	var out []finding
	for _, d := range visibleDocs(files) {
		for _, n := range names(d.group.Text(), unexported, exported) {
			if d.params[n] {
				continue
			}
			p := fset.Position(d.group.Pos())
			out = append(out, finding{pos: p.String(), doc: d.owner, name: n})
		}
	}
	return out
}

// parseDir parses the non-test Go files of a directory, whatever their
// build constraints.
func parseDir(t *testing.T, fset *token.FileSet, dir string) []*ast.File {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// TestDocsNameNoUnexported walks the module from its root, skipping
// internal/, examples/, bench/ (a module of its own), testdata and main
// packages, and checks every package's visible doc comments.
func TestDocsNameNoUnexported(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	skip := map[string]bool{"internal": true, "examples": true, "bench": true}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		base := d.Name()
		if path != root && (skip[rel] || base == "testdata" || strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_")) {
			return filepath.SkipDir
		}
		if path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		fset := token.NewFileSet()
		files := parseDir(t, fset, path)
		if len(files) == 0 || files[0].Name.Name == "main" {
			return nil
		}
		checked++
		for _, f := range check(fset, files) {
			t.Errorf("%s: doc of %s names unexported %s", f.pos, f.doc, f.name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 5 {
		t.Fatalf("checked only %d packages: is the walk rooted at the module?", checked)
	}
}

// TestCheck holds the rule to synthetic packages.
func TestCheck(t *testing.T) {
	const decls = `
const mirrorLimit = 4096

var mu int

func owns() bool { return true }

type Lock struct {
	Name  string
	queue []string
}

func (l *Lock) renew() {}

type hidden struct{}

// Exported is not visible: its type is not. It may say mirrorLimit.
func (hidden) Exported() {}
`
	cases := []struct {
		name string
		doc  string // the doc comment of an exported type Keeper
		want []string
	}{
		{"plain", "// Keeper keeps sessions alive.", nil},
		{"unexported constant", "// Keeper copies up to mirrorLimit keys.", []string{"mirrorLimit"}},
		{"constant in a word", "// Keeper copies mirrorLimits of keys.", nil},
		{"lowercase word in prose", "// Keeper holds a mu of owns and a queue.", nil},
		{"backquoted", "// Keeper takes `mu` first.", []string{"mu"}},
		{"called", "// Keeper asks owns() first.", []string{"owns"}},
		{"selected", "// Keeper reads Lock.queue and Lock.renew.", []string{"queue", "renew"}},
		{"after a sentence", "// Keeper waits.queue is not a selector of an exported name.", nil},
		{"exported field", "// Keeper sets Lock.Name.", nil},
		{"in a code block", "// Keeper:\n//\n//\tn := mirrorLimit", []string{"mirrorLimit"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := "// Package p is a test.\npackage p\n" + decls + "\n" + c.doc + "\ntype Keeper struct{}\n"
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, fd := range check(fset, []*ast.File{f}) {
				got = append(got, fd.name)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("found %q, want %q", got, c.want)
			}
		})
	}

	t.Run("parameter named like a field", func(t *testing.T) {
		src := "// Package p is a test.\npackage p\n" + decls +
			"\n// New makes a Lock of mirrorLimit; its queue is queue(see above).\nfunc New(queue []string) *Lock { return nil }\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, fd := range check(fset, []*ast.File{f}) {
			got = append(got, fd.doc+":"+fd.name)
		}
		want := []string{"New:mirrorLimit"}
		if !slices.Equal(got, want) {
			t.Errorf("found %q, want %q", got, want)
		}
	})

	t.Run("package doc and field doc", func(t *testing.T) {
		src := "// Package p waits mirrorLimit keys.\npackage p\n" + decls +
			"\n// T is a type.\ntype T struct {\n\t// N is at most mirrorLimit.\n\tN int\n\t// m is not visible: mirrorLimit.\n\tm int\n}\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, fd := range check(fset, []*ast.File{f}) {
			got = append(got, fd.doc+":"+fd.name)
		}
		want := []string{"package p:mirrorLimit", "T.N:mirrorLimit"}
		if !slices.Equal(got, want) {
			t.Errorf("found %q, want %q", got, want)
		}
	})
}

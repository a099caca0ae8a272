// Command release writes modules of this repository, as they are at tags
// of a local git repository, into a directory laid out as a Go module
// proxy, which GOPROXY=file://DIR serves. The release check builds one
// from local tags and installs and requires the published modules through
// it, as their users will once the tags are pushed; RELEASING.md says how
// a release is cut.
//
// Usage:
//
//	go run ./internal/release -repo DIR -proxy OUT -version V MODULEDIR...
//
// Each MODULEDIR (relative to the repository's root; "." for the library's
// own module) is taken at its tag: V for ".", MODULEDIR/V for the others,
// the tag scheme the go command expects of modules in subdirectories. The
// zip is made by the go command's own rules (golang.org/x/mod/zip), so its
// checksum is the one users will see.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

func main() {
	repo := flag.String("repo", ".", "the git repository")
	proxy := flag.String("proxy", "", "the module proxy directory to write into")
	version := flag.String("version", "", "the version (a semantic version with a leading v)")
	flag.Parse()
	if err := run(*repo, *proxy, *version, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(repo, proxy, version string, dirs []string) error {
	if proxy == "" || len(dirs) == 0 {
		return errors.New("want -proxy and at least one module directory")
	}
	if !semver.IsValid(version) || semver.Canonical(version) != version {
		return fmt.Errorf("version %q: want a canonical semantic version such as v0.1.0", version)
	}
	for _, dir := range dirs {
		if err := write(repo, proxy, version, path.Clean(dir)); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
	}
	return nil
}

// write adds the module in dir, at its tag for version, to the proxy.
func write(repo, proxy, version, dir string) error {
	tag, subdir := version, ""
	if dir != "." {
		tag, subdir = dir+"/"+version, dir
	}
	gomod, err := git(repo, "show", tag+":"+path.Join(subdir, "go.mod"))
	if err != nil {
		return err
	}
	modPath := modfile.ModulePath([]byte(gomod))
	if modPath == "" {
		return fmt.Errorf("no module line in go.mod at %s", tag)
	}
	when, err := git(repo, "log", "-1", "--format=%cI", tag)
	if err != nil {
		return err
	}
	at, err := time.Parse(time.RFC3339, strings.TrimSpace(when))
	if err != nil {
		return err
	}
	escPath, err := module.EscapePath(modPath)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(version)
	if err != nil {
		return err
	}
	base := filepath.Join(proxy, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(base, escVersion+".zip"))
	if err != nil {
		return err
	}
	m := module.Version{Path: modPath, Version: version}
	if err := zip.CreateFromVCS(f, m, repo, tag, subdir); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(base, escVersion+".mod"), []byte(gomod), 0o644); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, at.UTC()})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(base, escVersion+".info"), info, 0o644); err != nil {
		return err
	}
	return addToList(filepath.Join(base, "list"), version)
}

// addToList adds version to a proxy's list of a module's versions.
func addToList(list, version string) error {
	b, err := os.ReadFile(list)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(b))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// git runs git in repo and returns its output.
func git(repo string, args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", repo}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

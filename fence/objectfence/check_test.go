package objectfence_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/leasefence/leasefence/fence/objectfence"
)

// memStore is a store that honours If-Match / If-None-Match exactly, on
// its own version strings, but whose versions do not identify the content:
// here the size (as an "mtime-size" ETag with a coarse clock is, for two
// writes in the same second). doc.go: "A Fence builds the fence ... on any
// store that honours those conditions (Check proves it does)".
type memStore struct {
	mu   sync.Mutex
	objs map[string][]byte
}

func (s *memStore) ver(b []byte) string { return fmt.Sprintf(`"size-%d"`, len(b)) }

func (s *memStore) Get(_ context.Context, key string) ([]byte, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.objs[key]
	if !ok {
		return nil, "", objectfence.ErrNotFound
	}
	return b, s.ver(b), nil
}

func (s *memStore) Put(_ context.Context, key string, body []byte, c objectfence.Condition) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.objs[key]
	switch {
	case c.IfAbsent && ok:
		return "", objectfence.ErrPreconditionFailed
	case c.IfMatch != "" && !ok:
		return "", objectfence.ErrNotFound
	case c.IfMatch != "" && s.ver(cur) != c.IfMatch:
		return "", objectfence.ErrPreconditionFailed
	}
	s.objs[key] = append([]byte(nil), body...)
	return s.ver(body), nil
}

func (s *memStore) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, key)
	return nil
}

func (s *memStore) List(_ context.Context, prefix string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out, nil
}

// A store that honours If-Match and If-None-Match on versions that do not
// identify an object's content cannot hold the fence: Check refuses it,
// and so does the first Claim.
func TestCheckRefusesStoreWhoseVersionsRepeat(t *testing.T) {
	f, err := objectfence.New(&memStore{objs: map[string][]byte{}}, "m", "tables/orders")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := f.Check(ctx); !errors.Is(err, objectfence.ErrConditionsIgnored) {
		t.Fatalf("check of a store whose version is the body's size: %v, want ErrConditionsIgnored", err)
	}
	if _, err := f.Claim(ctx, 5); !errors.Is(err, objectfence.ErrConditionsIgnored) {
		t.Fatalf("claim on it: %v, want ErrConditionsIgnored", err)
	}
}

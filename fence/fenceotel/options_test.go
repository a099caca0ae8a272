package fenceotel_test

import (
	"errors"
	"testing"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fenceotel"
)

// Bad options are refused with fence.ErrInvalidArgument.
func TestNewRefusesBadOptions(t *testing.T) {
	for name, opt := range map[string]fenceotel.Option{
		"nil option":         nil,
		"nil TracerProvider": fenceotel.WithTracerProvider(nil),
		"nil MeterProvider":  fenceotel.WithMeterProvider(nil),
		"nil name attr func": fenceotel.WithNameAttribute(nil),
	} {
		if _, err := fenceotel.New(opt); !errors.Is(err, fence.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := fenceotel.New(); err != nil {
		t.Errorf("no options: %v", err)
	}
}

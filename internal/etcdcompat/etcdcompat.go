// Package etcdcompat holds what the library needs from etcd's client that
// the client's supported versions spell differently.
package etcdcompat

import (
	"reflect"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Compare returns the comparison c stands for, or nil if this client's
// Cmp is neither of the two shapes below. From etcd's client v3.7 on, a
// Cmp wraps it (GetCompare); before, Cmp is the protobuf type itself
// (type Cmp pb.Compare), which a conversion written here would not compile
// against v3.7, so reflection makes it.
func Compare(c clientv3.Cmp) *pb.Compare {
	if g, ok := any(&c).(interface{ GetCompare() *pb.Compare }); ok {
		return g.GetCompare()
	}
	to := reflect.TypeFor[pb.Compare]()
	if v := reflect.ValueOf(c); v.Type().ConvertibleTo(to) {
		pc := reflect.New(to)
		pc.Elem().Set(v.Convert(to))
		return pc.Interface().(*pb.Compare)
	}
	return nil
}

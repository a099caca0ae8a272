package fence

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
)

// tokenWidth is the length of an encoded token.
const tokenWidth = 16

// EncodeToken writes a token in the fixed-width form that fence records
// store: 16 lowercase hex digits of the token with its sign bit flipped, so
// that etcd's byte-wise comparison of values orders tokens as numbers over
// the whole int64 range. (Plain decimal would put "9" after "10".)
func EncodeToken(token int64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(token)^(1<<63))
	return hex.EncodeToString(b[:])
}

// DecodeToken reads a token written by EncodeToken. Anything else gives an
// error wrapping ErrBadRecord.
func DecodeToken(s string) (int64, error) {
	if len(s) != tokenWidth {
		return 0, fmt.Errorf("%w: %q: want %d hex digits", ErrBadRecord, s, tokenWidth)
	}
	var b [8]byte
	if _, err := hex.Decode(b[:], []byte(s)); err != nil {
		return 0, fmt.Errorf("%w: %q: %v", ErrBadRecord, s, err)
	}
	if EncodeToken(int64(binary.BigEndian.Uint64(b[:])^(1<<63))) != s {
		return 0, fmt.Errorf("%w: %q: not in canonical form", ErrBadRecord, s)
	}
	return int64(binary.BigEndian.Uint64(b[:]) ^ (1 << 63)), nil
}

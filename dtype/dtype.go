// Package dtype holds a tensor's element types and shapes: the safetensors
// format's dtype names with the torch and numpy spellings that map to them,
// shapes, and the size they give. It holds no memory and imports nothing of
// tensorfs, so file-format codecs (safetensors) and clients depend on it
// alone.
package dtype

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// MaxSize is the largest tensor size in bytes (2^53): the largest integer a
// JSON number (safetensors' data_offsets, the stats document) carries exactly.
// Larger sizes fail with ErrTooLarge.
const MaxSize = 1 << 53

// Sentinel errors; match with errors.Is. package tensor shares them, and fs
// maps them to EINVAL and EFBIG.
var (
	// ErrInvalid: an unknown dtype, a malformed shape, or a size that is not
	// whole bytes.
	ErrInvalid = errors.New("invalid argument")
	// ErrTooLarge: a size past MaxSize.
	ErrTooLarge = errors.New("size past the largest tensor size")
)

// DType is a canonical safetensors dtype name ("F32", "BF16", ...).
type DType string

// dtypeBits is the element size in bits of every dtype the safetensors format
// defines (safetensors' Dtype enum, including its sub-byte float types).
var dtypeBits = map[DType]int{
	"BOOL": 8, "U8": 8, "I8": 8, "U16": 16, "I16": 16, "U32": 32, "I32": 32,
	"U64": 64, "I64": 64, "F16": 16, "BF16": 16, "F32": 32, "F64": 64,
	"F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
	"C64": 64,
}

// dtypeAliases maps torch and numpy type names (lower case, module prefix
// stripped) to the canonical names.
var dtypeAliases = map[string]DType{
	"bool": "BOOL", "bool_": "BOOL",
	"uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16", "short": "I16",
	"uint32": "U32", "int32": "I32", "int": "I32", "intc": "I32",
	"uint64": "U64", "int64": "I64", "long": "I64",
	"float16": "F16", "half": "F16", "bfloat16": "BF16",
	"float32": "F32", "float": "F32", "single": "F32",
	"float64": "F64", "double": "F64",
	"float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
	"complex64": "C64", "cfloat": "C64",
	// The short spellings of serving and training configs (vLLM's
	// kv_cache_dtype, DeepSpeed's and Megatron's fp16/bf16 flags): "fp8"
	// alone is E4M3, the format those engines mean by it; AMD's *fnuz
	// variants encode differently and are not aliased.
	"fp16": "F16", "fp32": "F32", "fp64": "F64", "fp8": "F8_E4M3", "fp4": "F4",
	"fp8_e4m3": "F8_E4M3", "fp8_e5m2": "F8_E5M2", "e4m3": "F8_E4M3", "e5m2": "F8_E5M2", "e8m0": "F8_E8M0",
	"float8_e4m3": "F8_E4M3", "f8e4m3": "F8_E4M3", "f8e5m2": "F8_E5M2",
}

// numpyCodes are numpy's array-protocol type codes. They are accepted only
// with a byte-order mark ("<f4", "|u1", "=i8"), because bare they collide with
// safetensors names: numpy's f4 is float32 but F4 is a 4-bit float, and its i8
// is int64 but I8 is int8.
var numpyCodes = map[string]DType{
	"b1": "BOOL", "u1": "U8", "i1": "I8", "u2": "U16", "i2": "I16", "u4": "U32",
	"i4": "I32", "u8": "U64", "i8": "I64", "f2": "F16", "f4": "F32", "f8": "F64", "c8": "C64",
}

// Parse accepts a safetensors dtype name in any case ("F32", "bf16"), a
// torch or numpy type name ("float32", "torch.bfloat16", "np.int64"), or a
// numpy type code with its byte-order mark ("<f4", "|u1"), and returns the
// canonical name. Big-endian codes (">f4") are refused: tensors here are
// little-endian, as in safetensors. Errors: ErrInvalid for anything else.
func Parse(s string) (DType, error) {
	t := strings.TrimSpace(s)
	if d := DType(strings.ToUpper(t)); dtypeBits[d] != 0 {
		return d, nil
	}
	l := strings.ToLower(t)
	for _, p := range []string{"torch.", "numpy.", "np."} {
		l = strings.TrimPrefix(l, p)
	}
	if d, ok := dtypeAliases[l]; ok {
		return d, nil
	}
	if len(l) == 3 && strings.ContainsRune("<=|", rune(l[0])) {
		if d, ok := numpyCodes[l[1:]]; ok {
			return d, nil
		}
	}
	return "", fmt.Errorf("dtype %q: %w (want a safetensors name like F32, BF16, I64, F8_E4M3, a torch/numpy name like float32, a short one like fp16 or e4m3, or a numpy code like <f4)", s, ErrInvalid)
}

// Bits is the element size in bits (0 for an unknown dtype).
func (d DType) Bits() int { return dtypeBits[d] }

// Shape is a tensor's dimensions, outermost first; an empty Shape is a scalar.
type Shape []int64

// ParseShape accepts comma-separated non-negative decimal dims ("2,4,2"),
// optionally in brackets or parentheses with spaces ("[2, 4, 2]", "(4,)"); ""
// is a scalar. Errors: ErrInvalid.
func ParseShape(s string) (Shape, error) {
	t := strings.TrimSpace(s)
	if len(t) >= 2 && (t[0] == '[' && t[len(t)-1] == ']' || t[0] == '(' && t[len(t)-1] == ')') {
		t = strings.TrimSpace(t[1 : len(t)-1])
	}
	if t == "" {
		return Shape{}, nil
	}
	if len(t) > 1 {
		t = strings.TrimSuffix(t, ",") // Python's one-element tuple "(4,)"
	}
	if t == "" {
		return Shape{}, nil
	}
	parts := strings.Split(t, ",")
	sh := make(Shape, len(parts))
	for i, p := range parts {
		n, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
		if err != nil || n < 0 || n > MaxSize {
			return nil, fmt.Errorf("shape %q: dim %q is not an integer in [0, %d]: %w", s, p, int64(MaxSize), ErrInvalid)
		}
		sh[i] = n
	}
	return sh, nil
}

// String is the canonical comma-separated form ("2,4,2"; "" for a scalar).
func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.FormatInt(d, 10)
	}
	return strings.Join(parts, ",")
}

// Elems is the number of elements; ok is false when it overflows MaxSize.
func (s Shape) Elems() (n int64, ok bool) {
	n = 1
	for _, d := range s {
		hi, lo := bits.Mul64(uint64(n), uint64(d))
		if hi != 0 || lo > MaxSize {
			return 0, false
		}
		n = int64(lo)
	}
	return n, true
}

// NBytes is prod(shape) * bits(dtype) / 8. Errors: ErrInvalid for an unknown
// dtype or a sub-byte dtype whose total is not whole bytes, ErrTooLarge when the
// result exceeds MaxSize.
func NBytes(d DType, s Shape) (int64, error) {
	b := d.Bits()
	if b == 0 {
		return 0, fmt.Errorf("dtype %q: %w", d, ErrInvalid)
	}
	n, ok := s.Elems()
	if !ok {
		return 0, fmt.Errorf("shape %s: %w", s, ErrTooLarge)
	}
	hi, lo := bits.Mul64(uint64(n), uint64(b))
	if hi != 0 || lo/8 > MaxSize {
		return 0, fmt.Errorf("shape %s of %s: %w", s, d, ErrTooLarge)
	}
	if lo%8 != 0 {
		return 0, fmt.Errorf("shape %s of %s is %d bits, not whole bytes: %w", s, d, lo, ErrInvalid)
	}
	return int64(lo / 8), nil
}

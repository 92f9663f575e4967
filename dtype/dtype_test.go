package dtype

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]DType{
		"F32": "F32", "f32": "F32", "float32": "F32", "torch.float32": "F32", "np.float32": "F32",
		"bfloat16": "BF16", "BF16": "BF16", "int64": "I64", "long": "I64", "<f4": "F32",
		"uint8": "U8", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3", "F8_E5M2": "F8_E5M2",
		"half": "F16", "double": "F64", " I32 ": "I32", "F4": "F4",
		"f4": "F4", "i8": "I8", "u8": "U8", "f16": "F16", "i32": "I32", "<i8": "I64", "|u1": "U8", "=f8": "F64",
		// The configs' short spellings (a new user's first tries: fp16,
		// fp32, fp8 and e4m3 were refused while bf16 was accepted).
		"fp16": "F16", "FP32": "F32", "fp64": "F64", "fp8": "F8_E4M3", "e4m3": "F8_E4M3", "e5m2": "F8_E5M2",
		"fp8_e5m2": "F8_E5M2", "torch.float8_e5m2": "F8_E5M2", "bf16": "BF16", "e8m0": "F8_E8M0", "fp4": "F4",
	} {
		got, err := Parse(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "F31", "banana", "torch.", "F32\x00", ">f4", "<f3", "<x4", "float33", "float8_e4m3fnuz", "fp12"} {
		_, err := Parse(in)
		require.ErrorIs(t, err, ErrInvalid, "%q", in)
	}
}

func TestParseShape(t *testing.T) {
	for in, want := range map[string]Shape{
		"2,4,2": {2, 4, 2}, "": {}, "[2, 4]": {2, 4}, "(4,)": {4}, " 7 ": {7}, "0,3": {0, 3}, "[]": {},
	} {
		got, err := ParseShape(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
		require.Equal(t, want.String(), got.String())
	}
	for _, in := range []string{"a", "2,,4", "-1", "1.5", "2;4", "9007199254740993", ",", "[2,4"} {
		_, err := ParseShape(in)
		require.ErrorIs(t, err, ErrInvalid, "%q", in)
	}
}

func TestNBytes(t *testing.T) {
	n, err := NBytes("BF16", Shape{16, 8, 128})
	require.NoError(t, err)
	require.EqualValues(t, 32768, n)
	n, err = NBytes("F32", Shape{})
	require.NoError(t, err)
	require.EqualValues(t, 4, n, "a scalar is one element")
	n, err = NBytes("F4", Shape{3, 2})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	_, err = NBytes("F4", Shape{3})
	require.ErrorIs(t, err, ErrInvalid, "12 bits is not whole bytes")
	_, err = NBytes("F64", Shape{1 << 40, 1 << 20})
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = NBytes("F64", Shape{1 << 62, 1 << 62})
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = NBytes("X", Shape{1})
	require.ErrorIs(t, err, ErrInvalid)
}

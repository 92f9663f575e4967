package transfer

import "crypto/subtle"

func subtleEqual(a, b []byte) bool { return subtle.ConstantTimeCompare(a, b) == 1 }

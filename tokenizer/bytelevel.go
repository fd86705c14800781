package tokenizer

// Byte-level BPE vocabularies (GPT-2, Qwen) spell every byte as a printable
// character so that tokens are valid strings. Decoding maps each character
// of a token back to its byte. This is the fixed GPT-2 table: printable
// Latin-1 bytes stand for themselves, the remaining 68 bytes are shifted to
// U+0100 upwards in byte order.

// byteLevelRuneToByte maps a byte-level character to the byte it encodes.
var byteLevelRuneToByte = buildByteLevelTable()

func buildByteLevelTable() map[rune]byte {
	table := make(map[rune]byte, 256)
	printable := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	shifted := 0
	for b := 0; b < 256; b++ {
		if printable(b) {
			table[rune(b)] = byte(b)
			continue
		}
		table[rune(256+shifted)] = byte(b)
		shifted++
	}
	return table
}

// byteLevelTokenBytes returns the bytes a token stands for under the
// ByteLevel decoder. A token with any character outside the table (added
// tokens such as "<|im_start|>" are plain text, and may contain spaces or
// non-Latin characters) contributes its own UTF-8 bytes instead, exactly as
// the Rust decoder does.
func byteLevelTokenBytes(token string) []byte {
	out := make([]byte, 0, len(token))
	for _, r := range token {
		b, ok := byteLevelRuneToByte[r]
		if !ok {
			return []byte(token)
		}
		out = append(out, b)
	}
	return out
}

package tokenizer

import (
	"strconv"
	"strings"
	"time"
)

// strftime implements the C/Python strftime directives that chat templates
// use for date headers ("%d %b %Y" and friends) in the C locale.
func strftime(t time.Time, format string) string {
	var sb strings.Builder
	pad := func(n, width int) string {
		s := strconv.Itoa(n)
		for len(s) < width {
			s = "0" + s
		}
		return s
	}
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 == len(format) {
			sb.WriteByte(c)
			continue
		}
		i++
		switch format[i] {
		case 'a':
			sb.WriteString(t.Weekday().String()[:3])
		case 'A':
			sb.WriteString(t.Weekday().String())
		case 'b', 'h':
			sb.WriteString(t.Month().String()[:3])
		case 'B':
			sb.WriteString(t.Month().String())
		case 'd':
			sb.WriteString(pad(t.Day(), 2))
		case 'e':
			sb.WriteString(strings.Repeat(" ", 2-len(strconv.Itoa(t.Day()))) + strconv.Itoa(t.Day()))
		case 'm':
			sb.WriteString(pad(int(t.Month()), 2))
		case 'y':
			sb.WriteString(pad(t.Year()%100, 2))
		case 'Y':
			sb.WriteString(strconv.Itoa(t.Year()))
		case 'H':
			sb.WriteString(pad(t.Hour(), 2))
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			sb.WriteString(pad(h, 2))
		case 'M':
			sb.WriteString(pad(t.Minute(), 2))
		case 'S':
			sb.WriteString(pad(t.Second(), 2))
		case 'p':
			if t.Hour() < 12 {
				sb.WriteString("AM")
			} else {
				sb.WriteString("PM")
			}
		case 'j':
			sb.WriteString(pad(t.YearDay(), 3))
		case 'w':
			sb.WriteString(strconv.Itoa(int(t.Weekday())))
		case 'u':
			wd := int(t.Weekday())
			if wd == 0 {
				wd = 7
			}
			sb.WriteString(strconv.Itoa(wd))
		case 'Z':
			name, _ := t.Zone()
			sb.WriteString(name)
		case 'z':
			sb.WriteString(t.Format("-0700"))
		case 'F':
			sb.WriteString(t.Format("2006-01-02"))
		case 'T':
			sb.WriteString(t.Format("15:04:05"))
		case '%':
			sb.WriteByte('%')
		default:
			sb.WriteByte('%')
			sb.WriteByte(format[i])
		}
	}
	return sb.String()
}

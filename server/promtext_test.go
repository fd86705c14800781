package server_test

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// A strict reader of the Prometheus text exposition format (version 0.0.4), written from
// the format's specification, so the /metrics test checks the output against the format's
// rules rather than against the server's own writer. It rejects what Prometheus would
// reject and also what it would accept only by accident (duplicate series, a TYPE after
// samples, scattered families, non-cumulative buckets).

type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

type promFamily struct {
	name    string
	typ     string
	help    string
	samples []promSample
}

var (
	promMetricName = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	promLabelName  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

func parsePromText(text string) (map[string]*promFamily, error) {
	families := map[string]*promFamily{}
	closed := map[string]bool{} // families whose samples ended
	seen := map[string]bool{}   // series keys
	current := ""
	if !strings.HasSuffix(text, "\n") {
		return nil, fmt.Errorf("output does not end with a newline")
	}
	for n, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		lineNo := n + 1
		if strings.TrimSpace(line) == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			fields := strings.SplitN(line, " ", 4)
			if len(fields) < 3 || (fields[1] != "HELP" && fields[1] != "TYPE") {
				continue // a plain comment
			}
			name := fields[2]
			if !promMetricName.MatchString(name) {
				return nil, fmt.Errorf("line %d: bad metric name %q", lineNo, name)
			}
			f := families[name]
			if f == nil {
				f = &promFamily{name: name}
				families[name] = f
			}
			if len(f.samples) > 0 {
				return nil, fmt.Errorf("line %d: %s for %s after its samples", lineNo, fields[1], name)
			}
			rest := ""
			if len(fields) == 4 {
				rest = fields[3]
			}
			if fields[1] == "TYPE" {
				if f.typ != "" {
					return nil, fmt.Errorf("line %d: second TYPE for %s", lineNo, name)
				}
				switch rest {
				case "counter", "gauge", "histogram", "summary", "untyped":
					f.typ = rest
				default:
					return nil, fmt.Errorf("line %d: unknown type %q", lineNo, rest)
				}
			} else {
				f.help = rest
			}
			continue
		}
		s, err := parsePromSample(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", lineNo, err)
		}
		family := promFamilyOf(s.name, families)
		f := families[family]
		if f == nil {
			f = &promFamily{name: family, typ: "untyped"}
			families[family] = f
		}
		if family != current {
			if closed[family] {
				return nil, fmt.Errorf("line %d: samples of %s are not contiguous", lineNo, family)
			}
			if current != "" {
				closed[current] = true
			}
			current = family
		}
		key := s.name + promLabelKey(s.labels)
		if seen[key] {
			return nil, fmt.Errorf("line %d: duplicate series %s", lineNo, key)
		}
		seen[key] = true
		if f.typ == "counter" && (s.value < 0 || math.IsNaN(s.value)) {
			return nil, fmt.Errorf("line %d: counter %s is %g", lineNo, s.name, s.value)
		}
		f.samples = append(f.samples, s)
	}
	for _, f := range families {
		if f.typ == "histogram" {
			if err := checkPromHistogram(f); err != nil {
				return nil, err
			}
		}
	}
	return families, nil
}

// promFamilyOf maps a histogram's _bucket/_sum/_count samples to their family.
func promFamilyOf(name string, families map[string]*promFamily) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base := strings.TrimSuffix(name, suffix)
		if base != name {
			if f, ok := families[base]; ok && (f.typ == "histogram" || f.typ == "summary") {
				return base
			}
		}
	}
	return name
}

func parsePromSample(line string) (promSample, error) {
	s := promSample{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return s, fmt.Errorf("no value in %q", line)
	}
	s.name = line[:i]
	if !promMetricName.MatchString(s.name) {
		return s, fmt.Errorf("bad metric name %q", s.name)
	}
	rest := line[i:]
	if rest[0] == '{' {
		end, err := parsePromLabels(rest, s.labels)
		if err != nil {
			return s, err
		}
		rest = rest[end:]
	}
	if !strings.HasPrefix(rest, " ") {
		return s, fmt.Errorf("no space before the value in %q", line)
	}
	fields := strings.Fields(rest)
	if len(fields) < 1 || len(fields) > 2 {
		return s, fmt.Errorf("want a value and an optional timestamp in %q", line)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("bad value %q", fields[0])
	}
	s.value = v
	if len(fields) == 2 {
		if _, err := strconv.ParseInt(fields[1], 10, 64); err != nil {
			return s, fmt.Errorf("bad timestamp %q", fields[1])
		}
	}
	return s, nil
}

// parsePromLabels reads {a="x",b="y"} from the start of s and returns its length.
func parsePromLabels(s string, labels map[string]string) (int, error) {
	i := 1
	for {
		if i < len(s) && s[i] == '}' {
			return i + 1, nil
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			return 0, fmt.Errorf("label without '=' in %q", s)
		}
		name := s[i : i+eq]
		if !promLabelName.MatchString(name) {
			return 0, fmt.Errorf("bad label name %q", name)
		}
		if _, dup := labels[name]; dup {
			return 0, fmt.Errorf("label %q twice", name)
		}
		i += eq + 1
		if i >= len(s) || s[i] != '"' {
			return 0, fmt.Errorf("label %s value not quoted", name)
		}
		i++
		var value strings.Builder
		for {
			if i >= len(s) {
				return 0, fmt.Errorf("unterminated label value in %q", s)
			}
			c := s[i]
			if c == '"' {
				i++
				break
			}
			if c == '\\' {
				if i+1 >= len(s) {
					return 0, fmt.Errorf("dangling escape in %q", s)
				}
				switch s[i+1] {
				case '\\':
					value.WriteByte('\\')
				case '"':
					value.WriteByte('"')
				case 'n':
					value.WriteByte('\n')
				default:
					return 0, fmt.Errorf("bad escape \\%c in %q", s[i+1], s)
				}
				i += 2
				continue
			}
			if c == '\n' {
				return 0, fmt.Errorf("raw newline in a label value")
			}
			value.WriteByte(c)
			i++
		}
		labels[name] = value.String()
		if i < len(s) && s[i] == ',' {
			i++
		}
	}
}

func promLabelKey(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "{%s=%q}", k, labels[k])
	}
	return b.String()
}

// checkPromHistogram checks one unlabelled-apart-from-le histogram: buckets in increasing
// le order with non-decreasing counts, a +Inf bucket equal to _count, and a _sum.
func checkPromHistogram(f *promFamily) error {
	var prevLe, prevCount float64 = math.Inf(-1), 0
	var infCount, count float64 = -1, -1
	hasSum := false
	for _, s := range f.samples {
		switch s.name {
		case f.name + "_bucket":
			leText, ok := s.labels["le"]
			if !ok {
				return fmt.Errorf("%s bucket without le", f.name)
			}
			le, err := strconv.ParseFloat(leText, 64)
			if err != nil {
				return fmt.Errorf("%s: bad le %q", f.name, leText)
			}
			if le <= prevLe || s.value < prevCount {
				return fmt.Errorf("%s: bucket le=%s out of order or not cumulative", f.name, leText)
			}
			prevLe, prevCount = le, s.value
			if math.IsInf(le, 1) {
				infCount = s.value
			}
		case f.name + "_sum":
			hasSum = true
		case f.name + "_count":
			count = s.value
		default:
			return fmt.Errorf("histogram %s has sample %s", f.name, s.name)
		}
	}
	if infCount < 0 || count < 0 || !hasSum || infCount != count {
		return fmt.Errorf("histogram %s: +Inf bucket %g, count %g, sum present %v", f.name, infCount, count, hasSum)
	}
	return nil
}

// promValue returns the value of the series name{labels} or NaN.
func promValue(families map[string]*promFamily, family, name string, labels map[string]string) float64 {
	f := families[family]
	if f == nil {
		return math.NaN()
	}
	want := promLabelKey(labels)
	for _, s := range f.samples {
		if s.name == name && promLabelKey(s.labels) == want {
			return s.value
		}
	}
	return math.NaN()
}

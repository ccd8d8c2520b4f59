package ringlock

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sectionRows returns the cells of the rows of the first table under
// "## title" in clients/README.md, header and rule left out.
func sectionRows(t *testing.T, title string) [][]string {
	t.Helper()
	text, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(text), "\n## "+title+"\n")
	if start < 0 {
		t.Fatalf("no section %q", title)
	}
	section := string(text[start+1:])
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	var rows [][]string
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for index := range cells {
			cells[index] = strings.TrimSpace(cells[index])
		}
		rows = append(rows, cells)
	}
	if len(rows) < 3 {
		t.Fatalf("section %q has no table", title)
	}
	return rows[2:]
}

var durationCell = regexp.MustCompile(`^(\d+) (ms|s)$`)

// The defaults table of clients/README.md is this client's.
func TestDefaultsTableMatchesTheClient(t *testing.T) {
	defaults := defaultOptions()
	ours := map[string]time.Duration{
		"first reconnect delay":             defaults.reconnectDelayFirst,
		"longest reconnect delay":           defaults.reconnectDelayMax,
		"connect limit":                     defaults.connectLimit,
		"connect timeout":                   defaults.connectTimeout,
		"release retry interval":            defaults.releaseRetryInterval,
		"release retry window":              defaults.releaseRetryFor,
		"try-once wait":                     defaults.tryAcquireWait,
		"redirect limit":                    time.Duration(defaults.redirectLimit),
		"requests in flight per connection": time.Duration(defaults.maxInFlight),
		"silence before a ping":             defaults.suspectAfter,
		"ping answer limit":                 defaults.pingTimeout,
		"auto-extend period":                autoExtendDivisor,
	}
	seen := 0
	for _, row := range sectionRows(t, "Defaults") {
		setting, cell := row[0], row[1]
		want, ok := ours[setting]
		if !ok {
			t.Errorf("the table names %q, unknown here", setting)
			continue
		}
		seen++
		var got time.Duration
		if match := durationCell.FindStringSubmatch(cell); match != nil {
			number, _ := strconv.Atoi(match[1])
			unit := time.Second
			if match[2] == "ms" {
				unit = time.Millisecond
			}
			got = time.Duration(number) * unit
		} else if divisor, found := strings.CutPrefix(cell, "lease / "); found {
			number, _ := strconv.Atoi(divisor)
			got = time.Duration(number)
		} else {
			number, err := strconv.Atoi(cell)
			if err != nil {
				t.Errorf("%s: cannot read %q", setting, cell)
			}
			got = time.Duration(number)
		}
		if got != want {
			t.Errorf("%s: the table says %q, the client has %v", setting, cell, want)
		}
	}
	if seen != len(ours) {
		t.Errorf("the table has %d of the client's %d defaults", seen, len(ours))
	}
}

// The wait forms table names this client's forms.
func TestWaitFormsTableNamesTheGoForms(t *testing.T) {
	forms := map[string]string{}
	for _, row := range sectionRows(t, "Wait forms and calls") {
		forms[strings.SplitN(row[0], ":", 2)[0]] = row[3]
	}
	if !strings.Contains(forms["no limit"], "ringlock.NoLimit") || !strings.Contains(forms["try once"], "ringlock.TryOnce") {
		t.Fatalf("Go column: %q", forms)
	}
	if TryOnce != 0 || NoLimit <= WaitMax {
		t.Fatalf("TryOnce %v, NoLimit %v", TryOnce, NoLimit)
	}
}

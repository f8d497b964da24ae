package main

import (
	"bufio"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
)

// clockTicks is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTicks = 100

// processCPU is the CPU time (user and system) process pid has used, from
// /proc/<pid>/stat; 0 when it cannot be read (the process is gone).
func processCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command may hold spaces: the fields start after its ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state): utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(u+st) * time.Second / clockTicks
}

// load1 is the machine's 1-minute load average (/proc/loadavg is not
// namespaced: it is the whole machine's).
func load1() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return -1
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// cpuTimes is the machine's busy and total CPU time from /proc/stat.
type cpuTimes struct{ busy, total int64 }

func machineCPU() cpuTimes {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return cpuTimes{}
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 5 || fields[0] != "cpu" {
		return cpuTimes{}
	}
	var t cpuTimes
	for i, v := range fields[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		t.total += n
		// idle and iowait are fields 4 and 5 of the line.
		if i != 3 && i != 4 {
			t.busy += n
		}
	}
	return t
}

// busySince is the fraction of the machine's CPUs busy since t0, all
// processes counted (the benchmark's, and anyone else's).
func (t cpuTimes) busySince(t0 cpuTimes) float64 {
	if t.total <= t0.total {
		return 0
	}
	return float64(t.busy-t0.busy) / float64(t.total-t0.total)
}

// selfCPU is the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// verifyCost measures what a replica's CPU spends to verify the image as
// a fill does (gunzip, sha256 and md5 of every byte), in CPU seconds per
// byte of image: the blob is read unshaped from the registry's own port
// and checked in this process, whose other goroutines are idle meanwhile.
// The fills do the same work in three goroutines; their CPU time is the
// same.
func verifyCost(ctx context.Context, blobURL string, size int64) (perByte float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, blobURL, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: %s", blobURL, resp.Status)
	}
	runtime.GC()
	c0 := selfCPU()
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		return 0, err
	}
	s, m := sha256.New(), md5.New()
	n, err := io.Copy(io.MultiWriter(s, m), zr)
	if err != nil {
		return 0, err
	}
	if n != size {
		return 0, fmt.Errorf("the blob gunzips to %d bytes, want %d", n, size)
	}
	return (selfCPU() - c0).Seconds() / float64(n), nil
}

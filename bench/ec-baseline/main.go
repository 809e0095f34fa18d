// Command ec-baseline measures klauspost/reedsolomon on one goroutine for the
// erasure configs and chunk sizes that crates/ec benchmarks, so bench/ec-compare.sh
// can print our throughput as a ratio against it.
//
// Throughput is GB/s (1e9 bytes) of data per second: k * chunk_bytes per operation.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"time"

	"github.com/klauspost/reedsolomon"
)

type config struct{ k, m int }

var configs = []config{{4, 2}, {8, 3}, {10, 4}, {16, 4}}
var chunkSizes = []int{64 << 10, 1 << 20}

// Each cell runs warmUp once, then roundCount rounds of roundTime and reports
// the median round.
const (
	warmUp     = 300 * time.Millisecond
	roundTime  = 300 * time.Millisecond
	roundCount = 5
)

type result struct {
	Codec      string  `json:"codec"`
	K          int     `json:"k"`
	M          int     `json:"m"`
	ChunkBytes int     `json:"chunk_bytes"`
	Op         string  `json:"op"`
	GBPerS     float64 `json:"gb_per_s"`
}

func main() {
	jsonOut := flag.Bool("json", false, "print one JSON object per cell instead of a table")
	flag.Parse()
	// One OS thread runs Go code: the codec gets one core, like the Rust bench.
	runtime.GOMAXPROCS(1)

	codecName := "klauspost/reedsolomon " + moduleVersion("github.com/klauspost/reedsolomon")
	if !*jsonOut {
		fmt.Printf("%-36s %5s %9s %-8s %8s\n", "codec", "k+m", "chunk", "op", "GB/s")
	}
	for _, c := range configs {
		for _, chunkBytes := range chunkSizes {
			for _, r := range measureCell(codecName, c, chunkBytes) {
				if *jsonOut {
					line, err := json.Marshal(r)
					if err != nil {
						fail(err)
					}
					fmt.Println(string(line))
				} else {
					fmt.Printf("%-36s %2d+%-2d %8dK %-8s %8.2f\n", r.Codec, r.K, r.M, r.ChunkBytes>>10, r.Op, r.GBPerS)
				}
			}
		}
	}
}

func measureCell(codecName string, c config, chunkBytes int) []result {
	enc, err := reedsolomon.New(c.k, c.m, reedsolomon.WithMaxGoroutines(1))
	if err != nil {
		fail(err)
	}
	n := c.k + c.m
	rng := rand.New(rand.NewSource(int64(n*chunkBytes + 1)))
	chunks := make([][]byte, n)
	for i := range chunks {
		chunks[i] = make([]byte, chunkBytes)
		if i < c.k {
			rng.Read(chunks[i])
		}
	}
	if err := enc.Encode(chunks); err != nil {
		fail(err)
	}
	original := make([][]byte, n)
	for i := range chunks {
		original[i] = append([]byte(nil), chunks[i]...)
	}

	encode := func() {
		if err := enc.Encode(chunks); err != nil {
			fail(err)
		}
	}
	// Decoding loses data chunks 0..lost; slicing them to length 0 keeps their
	// capacity, so ReconstructData writes into the same memory every time.
	decode := func(lost int) func() {
		return func() {
			for i := 0; i < lost; i++ {
				chunks[i] = chunks[i][:0]
			}
			if err := enc.ReconstructData(chunks); err != nil {
				fail(err)
			}
		}
	}
	dataBytes := c.k * chunkBytes
	out := []result{
		{codecName, c.k, c.m, chunkBytes, "encode", measure(encode, dataBytes)},
		{codecName, c.k, c.m, chunkBytes, "decode1", measure(decode(1), dataBytes)},
		{codecName, c.k, c.m, chunkBytes, "decodem", measure(decode(c.m), dataBytes)},
	}
	for i := range chunks {
		if string(chunks[i]) != string(original[i]) {
			fail(fmt.Errorf("%d+%d chunk %d differs after decoding", c.k, c.m, i))
		}
	}
	return out
}

// measure returns the median GB/s of roundCount rounds of op.
func measure(op func(), bytesPerOp int) float64 {
	for start := time.Now(); time.Since(start) < warmUp; {
		op()
	}
	rates := make([]float64, 0, roundCount)
	for range roundCount {
		ops := 0
		start := time.Now()
		for time.Since(start) < roundTime {
			op()
			ops++
		}
		rates = append(rates, float64(ops*bytesPerOp)/time.Since(start).Seconds()/1e9)
	}
	sort.Float64s(rates)
	return rates[len(rates)/2]
}

func moduleVersion(path string) string {
	info, ok := debug.ReadBuildInfo()
	if ok {
		for _, dep := range info.Deps {
			if dep.Path == path {
				return dep.Version
			}
		}
	}
	return "(unknown version)"
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "error:", err)
	os.Exit(1)
}

// Command dflash-mlx: fast, lossless LLM inference on MLX with DFlash speculative decoding.
package main

import (
	"os"

	"github.com/dflash-mlx/dflash-mlx/cli"
)

func main() { os.Exit(cli.Main(os.Args)) }

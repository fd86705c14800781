// Package cli is the dflash-mlx command line (urfave/cli/v2): run, chat, serve, bench,
// download, models, demo and version. It resolves model IDs through the hub client and the
// draft registry, loads the target, drafter and tokenizer on the MLX thread, and drives the
// engine. cmd/dflash-mlx only calls Main.
package cli

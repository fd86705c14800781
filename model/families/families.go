// Package families links every model family into a binary: importing it runs each family's
// init, which registers the family's model_type with model.Register. Commands and tests that
// load checkpoints by their config import it; a family is added by one import line here.
package families

import (
	_ "github.com/dflash-mlx/dflash-mlx/model/qwen3"  // model_type qwen3
	_ "github.com/dflash-mlx/dflash-mlx/model/qwen35" // model_type qwen3_5
)

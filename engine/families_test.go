package engine

// The loops' tests load target checkpoints of the registered families.
import _ "github.com/dflash-mlx/dflash-mlx/model/families"

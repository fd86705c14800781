package model_test

// The model package's external tests load checkpoints of the registered families.
import _ "github.com/dflash-mlx/dflash-mlx/model/families"

module github.com/dflash-mlx/dflash-mlx

go 1.26

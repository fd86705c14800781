package model

import "errors"

// ErrNoMTP is the error a family returns, wrapped with the reason, when the
// multi-token-prediction head is asked for and there is none: the checkpoint carries no
// mtp.* tensors (most MLX conversions drop them, and a config's mtp_num_hidden_layers does
// not say the tensors are there), or the model was loaded without LoadOptions.MTP. Test it
// with errors.Is; its text is meant for a command line to show.
var ErrNoMTP = errors.New("no multi-token-prediction head")

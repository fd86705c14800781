package model

import "errors"

// ErrNoMTP is the error a family returns, wrapped with the model's folder, when the
// multi-token-prediction head is asked for and the checkpoint carries none (most MLX
// conversions drop the mtp.* tensors; a config's mtp_num_hidden_layers does not say the
// tensors are there) or it was loaded without LoadOptions.MTP. Test it with errors.Is.
var ErrNoMTP = errors.New("the checkpoint has no multi-token-prediction head (no mtp.* tensors); use a checkpoint that keeps them, such as the original Hugging Face release or an -MTP conversion")

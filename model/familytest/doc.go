// Package familytest shows that a model family is added from its own package: its test
// registers a family under a new model_type from outside package model and loads a
// checkpoint of that type through model.Load, with no change to model.
package familytest

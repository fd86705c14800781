package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/hub"
	"github.com/dflash-mlx/dflash-mlx/model"
)

func downloadCommand() *cli.Command {
	return &cli.Command{
		Name:      "download",
		Usage:     "pre-fetch a target model and its DFlash drafter into the Hugging Face cache",
		ArgsUsage: "[TARGET-ID]",
		Description: `Downloads the target (default ` + DefaultTarget + `) and the drafter the registry
pairs with it (or --draft-model) into the standard cache (HF_HOME / HF_HUB_CACHE), where
Python tools find them too. Interrupted downloads resume. A target whose model_type
dflash-mlx cannot load is refused once its config.json is read, before any weights move.

Examples:
  dflash-mlx download                                # the default pair
  dflash-mlx download mlx-community/Qwen3-8B-4bit    # and its drafter z-lab/Qwen3-8B-DFlash-b16
  dflash-mlx download mlx-community/Qwen3-4B-bf16 --no-draft
  HF_HUB_CACHE=/data/hf dflash-mlx download Qwen/Qwen3-4B --revision main`,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "draft-model", Usage: "drafter to fetch (default: from the registry)"},
			&cli.BoolFlag{Name: "no-draft", Usage: "fetch the target only"},
			&cli.StringFlag{Name: "revision", Usage: "target revision"},
			&cli.StringFlag{Name: "drafts-file", Usage: "extra target→draft pairs (JSON)"},
			&cli.BoolFlag{Name: "quiet", Aliases: []string{"q"}},
		},
		Action: func(c *cli.Context) error {
			ids, err := trailingFlags(c)
			if err != nil {
				return err
			}
			if len(ids) > 1 {
				return cli.Exit(fmt.Sprintf("download takes one target ID, got %d: %s", len(ids), strings.Join(ids, " ")), 2)
			}
			target := DefaultTarget
			if len(ids) == 1 {
				target = ids[0]
			}
			cfg := LoadConfig{Target: target, Draft: c.String("draft-model"), NoDraft: c.Bool("no-draft"), DraftsFile: c.String("drafts-file")}
			client, err := hub.NewClientFromEnv()
			if err != nil {
				return err
			}
			if err := checkLoadable(c.Context, client, target, c.String("revision")); err != nil {
				return err
			}
			draftRef, err := resolveDraft(cfg)
			if err != nil {
				return err
			}
			opts := hub.DownloadOptions{Revision: c.String("revision"), Quiet: c.Bool("quiet"), Progress: os.Stderr}
			for _, ref := range []string{target, draftRef} {
				if ref == "" {
					continue
				}
				m, err := client.ResolveModel(c.Context, ref, opts)
				if err != nil {
					return fmt.Errorf("%s: %w", ref, err)
				}
				fmt.Printf("%s → %s\n", ref, m.Dir)
				opts.Revision = ""
			}
			if draftRef == "" && !c.Bool("no-draft") {
				fmt.Fprintf(os.Stderr, "note: no DFlash draft known for %s\n", target)
			}
			return nil
		},
	}
}

func modelsCommand() *cli.Command {
	return &cli.Command{
		Name:  "models",
		Usage: "list cached models and the known target → draft pairs",
		Description: `Lists the models in the Hugging Face cache (HF_HOME / HF_HUB_CACHE) with their size
and the drafter the registry pairs with each, then the registry's pairs. Your own pairs
(--drafts-file, default ~/.config/dflash-mlx/drafts.json) come first and win.

Examples:
  dflash-mlx models
  dflash-mlx models --json | jq -r '.cached[].repo_id'
  HF_HUB_CACHE=/data/hf dflash-mlx models
  dflash-mlx models --drafts-file ./drafts.json      # check your own pairs resolve`,
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
			&cli.StringFlag{Name: "drafts-file", Usage: "extra target→draft pairs (JSON)"},
		},
		Action: func(c *cli.Context) error {
			env, err := hub.LoadEnv()
			if err != nil {
				return err
			}
			cached, err := hub.ListCachedModels(env.CacheDir)
			if err != nil {
				return err
			}
			path := c.String("drafts-file")
			if path == "" {
				path = draft.DefaultUserFile()
			}
			reg, err := draft.NewRegistry(path)
			if err != nil {
				return err
			}
			type row struct {
				RepoID string `json:"repo_id"`
				Size   int64  `json:"size_bytes"`
				Draft  string `json:"draft,omitempty"`
				// Drafter: the repository is a known DFlash drafter, not a target.
				Drafter bool `json:"drafter,omitempty"`
				// Incomplete: a download was interrupted or the snapshot lacks files
				// (Missing); downloading again resumes.
				Incomplete bool     `json:"incomplete"`
				Missing    []string `json:"missing,omitempty"`
				// Unsupported: its config.json names a model_type this build cannot load.
				ModelType   string `json:"model_type,omitempty"`
				Unsupported bool   `json:"unsupported,omitempty"`
				Dir         string `json:"dir"`
			}
			var rows []row
			for _, m := range cached {
				r := row{RepoID: m.RepoID, Size: m.SizeOnDisk, Drafter: reg.IsDraft(m.RepoID), Incomplete: m.Incomplete(), Dir: m.Dir}
				r.Draft, _ = reg.Resolve(m.RepoID)
				if len(m.Revisions) > 0 {
					r.ModelType = cachedModelType(m.Revisions[0].Dir)
					r.Unsupported = r.ModelType != "" && !slices.Contains(model.Families(), r.ModelType)
				}
				if r.Incomplete {
					if len(m.Revisions) > 0 {
						r.Missing = m.Revisions[0].Missing
					}
					if m.PartialBytes > 0 {
						r.Missing = append(r.Missing, fmt.Sprintf("%s of unfinished downloads", human(m.PartialBytes)))
					}
				}
				rows = append(rows, r)
			}
			pairs := reg.Pairs()
			if c.Bool("json") {
				return printJSON(map[string]any{"cache_dir": env.CacheDir, "cached": rows, "pairs": pairs})
			}
			fmt.Printf("Cached models (%s):\n", env.CacheDir)
			if len(rows) == 0 {
				fmt.Println("  (none)")
			}
			for _, r := range rows {
				d := ""
				switch {
				case r.Drafter:
					d = "  (DFlash drafter)"
				case r.Draft != "":
					d = "  draft: " + r.Draft
				}
				switch {
				case r.Unsupported:
					d += fmt.Sprintf("  this build cannot load model_type %q", r.ModelType)
				case r.Incomplete:
					what := strings.ReplaceAll(strings.Join(r.Missing, ", "), "*.safetensors", "no weights")
					d += fmt.Sprintf("  incomplete (%s): `dflash-mlx download %s` resumes", what, r.RepoID)
				}
				fmt.Printf("  %-50s %9s%s\n", r.RepoID, human(r.Size), d)
			}
			fmt.Println("\nKnown target → DFlash draft pairs (targets match by name prefix, e.g. -bf16/-4bit/-8bit):")
			for _, p := range pairs {
				if p.Served {
					fmt.Printf("  %-20s → %s\n", p.Target, p.Draft)
				} else {
					fmt.Printf("  %-20s → %-30s  (not served: this build cannot load %s models)\n", p.Target, p.Draft, p.Family)
				}
			}
			fmt.Printf("\nAdd pairs in %s: [{\"target\": \"org/Model\", \"draft\": \"org/Model-DFlash\"}]\n", path)
			return nil
		},
	}
}

// trailingFlags applies the command's flags that follow its arguments and returns the
// arguments. urfave/cli stops reading flags at the first argument, so without this
// `download ID --no-draft` would take "--no-draft" for a second ID.
func trailingFlags(c *cli.Context) ([]string, error) {
	args := c.Args().Slice()
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if a == "-" || !strings.HasPrefix(a, "-") {
			pos = append(pos, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		var flag cli.Flag
		for _, f := range c.Command.Flags {
			for _, n := range f.Names() {
				if n == name {
					flag = f
				}
			}
		}
		if flag == nil {
			return nil, cli.Exit("flag provided but not defined: -"+name, 2)
		}
		if _, isBool := flag.(*cli.BoolFlag); isBool && !hasValue {
			value = "true"
		} else if !hasValue {
			if i+1 == len(args) {
				return nil, cli.Exit("flag needs an argument: -"+name, 2)
			}
			i++
			value = args[i]
		}
		// Aliases are separate entries of the flag set: set them all, as parsing does.
		for _, n := range flag.Names() {
			if err := c.Set(n, value); err != nil {
				return nil, cli.Exit(fmt.Sprintf("invalid value %q for flag -%s: %v", value, name, err), 2)
			}
		}
	}
	return pos, nil
}

// cachedModelType is the model_type in a snapshot's config.json, "" when it has none or
// cannot be read.
func cachedModelType(snapshot string) string {
	b, err := os.ReadFile(filepath.Join(snapshot, "config.json"))
	if err != nil {
		return ""
	}
	var cfg struct {
		ModelType string `json:"model_type"`
	}
	if json.Unmarshal(b, &cfg) != nil {
		return ""
	}
	return cfg.ModelType
}

package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/tokenizer"
)

func chatCommand() *cli.Command {
	flags := append(modelFlags(), samplingFlags()...)
	flags = append(flags, promptCacheFlags(true)...)
	flags = append(flags,
		&cli.StringFlag{Name: "system", Usage: "system message"},
		&cli.BoolFlag{Name: "enable-thinking", Usage: "let Qwen3 think before answering"},
	)
	return &cli.Command{
		Name:  "chat",
		Usage: "talk to the model (multi-turn; the whole history goes through the chat template)",
		Description: `An interactive chat. Each turn re-renders the full conversation through the
model's own chat template. Ctrl-C stops the current answer (the partial answer is
kept in the history); Ctrl-D or /exit leaves.

Commands:
  /reset           forget the conversation (keeps the system message)
  /system TEXT     set the system message and reset
  /stats           statistics of the last answer
  /exit            quit

Examples:
  dflash-mlx chat                                    # the default Qwen3-4B pair
  dflash-mlx chat --system "You are a terse Go reviewer." --temperature 0.7
  dflash-mlx chat --target-model mlx-community/Qwen3-8B-4bit --enable-thinking
  dflash-mlx chat --target-model ./my-model --no-draft   # plain decoding, to compare`,
		Flags:  flags,
		Action: chatAction,
	}
}

// chatSession is the REPL state; in and out are parameters so tests can drive it.
type chatSession struct {
	s          *Session
	sp         func() engine.Request
	system     string
	think      bool
	history    []tokenizer.Message
	last       *engine.Result
	out        io.Writer
	lastPrompt []int32 // the last turn's prompt (tests read it)
}

func chatAction(c *cli.Context) error {
	sp, err := samplingParams(c)
	if err != nil {
		return err
	}
	cfg := loadConfig(c)
	if cfg.DistBackend != "" {
		return cli.Exit(noSplitChat, 2)
	}
	if cfg.PromptCache, err = promptCacheConfig(c); err != nil {
		return err
	}
	s, err := Open(context.Background(), cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	s.Notice(s.BlockSizeNote(c.Int("block-size")))
	cs := &chatSession{s: s, system: c.String("system"), think: c.Bool("enable-thinking"), out: os.Stdout}
	cs.sp = func() engine.Request {
		return engine.Request{MaxTokens: c.Int("max-new-tokens"), Sampling: sp, StopTokens: s.StopTokens(), BlockSize: c.Int("block-size")}
	}
	mode := "plain decoding"
	if s.DraftRef != "" {
		mode = "DFlash with " + s.DraftRef
	}
	fmt.Fprintf(os.Stderr, "chatting with %s (%s). /exit to quit, Ctrl-C stops an answer.\n", s.TargetRef, mode)
	return cs.loop(os.Stdin)
}

// interrupts turns SIGINT into "cancel the current answer" while one is running.
type interrupts struct {
	mu     sync.Mutex
	cancel context.CancelFunc
}

func (i *interrupts) set(c context.CancelFunc) { i.mu.Lock(); i.cancel = c; i.mu.Unlock() }
func (i *interrupts) fire() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.cancel != nil {
		i.cancel()
		return true
	}
	return false
}

func (cs *chatSession) loop(in io.Reader) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt)
	defer signal.Stop(sig)
	var intr interrupts
	go func() {
		for range sig {
			if !intr.fire() {
				fmt.Fprint(cs.out, "\n(Ctrl-D or /exit to quit)\n>>> ")
			}
		}
	}()
	r := bufio.NewReader(in)
	for {
		fmt.Fprint(cs.out, ">>> ")
		line, err := r.ReadString('\n')
		if err != nil && line == "" {
			fmt.Fprintln(cs.out)
			return nil
		}
		line = strings.TrimRight(line, "\r\n")
		if strings.TrimSpace(line) == "" {
			continue
		}
		if strings.HasPrefix(line, "/") {
			if quit := cs.command(line); quit {
				return nil
			}
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		intr.set(cancel)
		err = cs.turn(ctx, line)
		intr.set(nil)
		cancel()
		if err != nil {
			fmt.Fprintf(cs.out, "\nerror: %v\n", err)
		}
	}
}

func (cs *chatSession) command(line string) (quit bool) {
	cmd, arg, _ := strings.Cut(line, " ")
	switch cmd {
	case "/exit", "/quit", "/bye":
		return true
	case "/reset":
		cs.history = nil
		fmt.Fprintln(cs.out, "(conversation cleared)")
	case "/system":
		cs.system = strings.TrimSpace(arg)
		cs.history = nil
		fmt.Fprintln(cs.out, "(system message set; conversation cleared)")
	case "/stats":
		if cs.last == nil {
			fmt.Fprintln(cs.out, "(no answer yet)")
		} else {
			printRunStats(cs.out, runOutput{TargetModel: cs.s.TargetRef, DraftModel: cs.s.DraftRef, FinishReason: cs.last.FinishReason, Stats: cs.last.Stats})
		}
	default:
		fmt.Fprintf(cs.out, "unknown command %s (/reset, /system TEXT, /stats, /exit)\n", cmd)
	}
	return false
}

// turn sends the whole conversation plus the new user message through the template and
// appends the answer (even a partial one) to the history.
func (cs *chatSession) turn(ctx context.Context, user string) error {
	msgs := []tokenizer.Message{}
	if cs.system != "" {
		msgs = append(msgs, tokenizer.NewMessage("system", cs.system))
	}
	msgs = append(msgs, cs.history...)
	msgs = append(msgs, tokenizer.NewMessage("user", user))
	think := cs.think
	opts := tokenizer.ChatOptions{AddGenerationPrompt: true, EnableThinking: &think}
	if resolved.Diagnostics.ChatDebug {
		// Shows the exact rendered prompt (tests check that history is kept).
		if text, err := cs.s.Tok.ApplyChatTemplate(msgs, opts); err == nil {
			fmt.Fprintf(os.Stderr, "[prompt]%s[/prompt]\n", text)
		}
	}
	ids, err := cs.s.ChatPrompt(msgs, opts)
	if err != nil {
		return err
	}
	cs.lastPrompt = ids
	req := cs.sp()
	// A chat's --max-new-tokens caps each answer; a turn whose history leaves less room
	// gets a shorter answer (finish "length"), and one that leaves none is refused.
	if err := cs.s.CheckRoom(len(ids), req.MaxTokens, false); err != nil {
		return fmt.Errorf("%v (/reset starts a new conversation)", err)
	}
	req.Prompt = ids
	req.PrefixMarks = cs.s.PrefixMarks(ids)
	req.Detok = cs.s.Tok.NewStreamDecoder(true)
	res, err := cs.s.Generate(ctx, req, func(ev engine.Event) error {
		fmt.Fprint(cs.out, ev.Text)
		return nil
	})
	if err != nil {
		return err
	}
	if res.FinishReason == engine.FinishCancelled {
		fmt.Fprint(cs.out, " [stopped]")
	}
	fmt.Fprintln(cs.out)
	cs.last = &res
	cs.history = append(cs.history, tokenizer.NewMessage("user", user), tokenizer.NewMessage("assistant", res.Text))
	return nil
}

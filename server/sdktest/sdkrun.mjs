// The SDK scripts' test runner: every test runs, each even when an earlier one failed (a
// test that returns a string was skipped, for that reason); the last line is
// "LABEL: N passed, N failed" and the exit status is 1 when anything failed.
export async function runTests(tests, label) {
  let passed = 0;
  let failed = 0;
  for (const [name, fn] of Object.entries(tests)) {
    try {
      const skipped = await fn();
      if (skipped) {
        console.log(`skip ${name}: ${skipped}`);
        continue;
      }
      passed++;
      console.log(`ok   ${name}`);
    } catch (e) {
      failed++;
      console.log(`FAIL ${name}\n${e.stack ?? e}`);
    }
  }
  console.log(`${label}: ${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

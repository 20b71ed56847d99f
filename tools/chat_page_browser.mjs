// The chat page of `hob serve` in a real headless browser: send a message and see the streamed answer,
// then send another and stop it midway; a screenshot of each step.
//
//   node tools/chat_page_browser.mjs URL OUT_DIR
//
// Needs playwright-core (npm) and Debian's Chromium at /usr/bin/chromium; `hob serve` already running at URL.
// Exit status 1 when a step fails.
import { chromium } from "playwright-core";

const [url, out] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage({ viewport: { width: 1000, height: 700 } });
const log = (...a) => console.log(new Date().toISOString(), ...a);
let failed = false;
try {
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0);
  log("page loaded, model", await page.textContent("#model"));
  await page.fill("#temp", "0");
  await page.fill("#max", "48");
  await page.fill("#input", "What is the capital of France?");
  await page.keyboard.press("Enter");
  // Streamed: text appears before the answer is done (the Stop button still shows).
  await page.waitForFunction(() => {
    const a = document.querySelectorAll(".assistant");
    return a.length && a[a.length - 1].textContent.length > 0 && !document.getElementById("stop").hidden;
  });
  const partial = await page.evaluate(() => [...document.querySelectorAll(".assistant")].pop().textContent);
  log("streaming, so far:", JSON.stringify(partial));
  await page.waitForSelector("#send:not([hidden])");
  const first = await page.evaluate(() => [...document.querySelectorAll(".assistant")].pop().textContent);
  const stats = await page.evaluate(() => [...document.querySelectorAll(".stats")].pop()?.textContent);
  log("answer:", JSON.stringify(first), "|", stats);
  if (!first.length || first.length <= partial.length && first === partial && !stats) throw new Error("no streamed answer");
  await page.screenshot({ path: `${out}/chat-page-answer.png` });

  // A long answer, stopped once some of it has arrived.
  await page.fill("#max", "400");
  await page.fill("#input", "Write a long story about a lighthouse keeper.");
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => [...document.querySelectorAll(".assistant")].pop().textContent.length > 40);
  await page.click("#stop");
  await page.waitForSelector("#send:not([hidden])");
  const stopped = await page.evaluate(() => [...document.querySelectorAll(".stats")].pop()?.textContent);
  const story = await page.evaluate(() => [...document.querySelectorAll(".assistant")].pop().textContent);
  log("after Stop:", JSON.stringify(stopped), story.length, "characters kept");
  if (stopped !== "[stopped]") throw new Error(`the answer was not stopped: ${stopped}`);
  await page.screenshot({ path: `${out}/chat-page-stopped.png` });
} catch (e) {
  failed = true;
  log("FAILED:", e.message);
  await page.screenshot({ path: `${out}/chat-page-failed.png` }).catch(() => {});
}
await browser.close();
process.exit(failed ? 1 : 0);

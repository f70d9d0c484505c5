// The browser side of tests/web.rs: opens the status page in headless Chromium (the system's,
// driven by playwright-core) and reports what it sees, one line at a time on stdout:
//   ready <nickname>       the page loaded and its live feed is connected
//   mounts <peer> <list>   what the peers table says this node may use on <peer> (once the
//                          list is not empty)
//   shown <peer>           a live session of <peer> appeared (shot: <dir>/live.png)
//   escaped               a tool name that is markup (the test calls it) shows as text
//   gone <peer>            it disappeared, in the same document (no reload)
//   screenshot <path>      the final screenshot
//   errors <n> <first>     console errors and page errors seen (a CSP violation is one)
// Any failure is a line `fail <why>` and exit code 1.
// Usage: NODE_PATH=target/web/node_modules node drive.cjs URL PEER SHOT_DIR
"use strict";
const { chromium } = require("playwright-core");
const path = require("node:path");
const fs = require("node:fs");

const [url, peer, shots] = process.argv.slice(2);
const wait = 20_000;
const HOSTILE = '<b id="injected">';
const say = (line) => process.stdout.write(line + "\n");

async function main() {
  fs.mkdirSync(shots, { recursive: true });
  let browser;
  const errors = [];
  try {
    // Playwright gives the browser a fresh profile of its own. Chromium's background
    // connections go nowhere on a closed network: switched off.
    browser = await chromium.launch({
      executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      args: [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
      ],
    });
    const page = await browser.newPage({ viewport: { width: 1200, height: 900 } });
    page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(url);
    await page.waitForSelector("#live.up", { timeout: wait });
    // Stays set as long as the document does: a reload would lose it.
    await page.evaluate(() => { window.sameDocument = true; });
    say("ready " + (await page.textContent("#nickname")));
    // The peers table: peer in the second column, what this node may use there in the sixth.
    const mounts = await page.waitForFunction(
      (p) => {
        const row = [...document.querySelectorAll("#peers tbody tr")]
          .find((tr) => tr.children[1] && tr.children[1].textContent === p);
        const cell = row && row.children[5];
        return cell && cell.textContent ? cell.textContent : null;
      },
      peer,
      { timeout: wait },
    );
    say("mounts " + peer + " " + (await mounts.jsonValue()));
    const session = `#sessions li[data-peer="${peer}"]`;
    await page.waitForSelector(session, { timeout: wait });
    await page.screenshot({ path: path.join(shots, "live.png"), fullPage: true });
    say("shown " + peer);
    // What a peer names reaches the page as text: a tool name that is markup stays text.
    await page.waitForFunction(
      (m) => [...document.querySelectorAll("#recent td")].some((td) => td.textContent.includes(m)),
      HOSTILE,
      { timeout: wait },
    );
    if (await page.evaluate(() => document.getElementById("injected") !== null)) {
      throw new Error("a tool name became markup");
    }
    say("escaped");
    await page.waitForSelector(session, { state: "detached", timeout: wait });
    if (!(await page.evaluate(() => window.sameDocument === true))) {
      throw new Error("the page was reloaded");
    }
    say("gone " + peer);
    const shot = path.join(shots, "after.png");
    await page.screenshot({ path: shot, fullPage: true });
    say("screenshot " + shot);
    say(`errors ${errors.length} ${errors[0] || ""}`.trim());
  } catch (e) {
    say("fail " + String(e.message || e).split("\n")[0]);
    process.exitCode = 1;
  } finally {
    if (browser) await browser.close();
  }
}

main();

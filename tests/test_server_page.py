"""The page `serve` answers at /, in a real headless browser (Debian's chromium and its
driver, through Selenium): type, translate, read the translation, hover a word."""

import os
import shutil

import httpx
import pytest

from tests.export_helpers import tiny_export
from tests.server_helpers import running, server

webdriver = pytest.importorskip("selenium.webdriver")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER),
    reason="needs a browser and its driver: apt-get install chromium chromium-driver")

SENTENCE = "A dog runs across the green field."


@pytest.fixture(scope="module")
def exported():
    return tiny_export()


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-dev-shm-usage", "--window-size=390,844"):  # a phone's width
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    yield driver
    driver.quit()


def test_the_page_translates_and_highlights_a_words_source(exported, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    service = server.Service(exported.saved_model)
    with running(service) as url:
        expected = httpx.post(f"{url}/translate", json={
            "sentences": [SENTENCE], "beam": True, "alignment": True, "n_best": 3},
            timeout=120).json()["translations"][0]
        browser.get(url + "/")
        text = browser.find_element(By.ID, "sentences")
        text.send_keys(SENTENCE)
        text.send_keys(Keys.CONTROL, Keys.ENTER)  # the keyboard's way; the button's below
        WebDriverWait(browser, 60).until(
            lambda b: b.find_elements(By.CSS_SELECTOR, ".result .translation"))
        browser.find_element(By.ID, "translate").click()
        WebDriverWait(browser, 60).until(
            lambda b: "translated" in b.find_element(By.ID, "status").text)
        translation = browser.find_element(By.CSS_SELECTOR, ".result .translation")
        assert translation.text.split() == expected["translation"].split()
        # The first translation word with an alignment: hovering it marks its sources.
        target, source = expected["alignment"][0][1], expected["alignment"][0][0]
        sources = {s for s, t in expected["alignment"] if t == target}
        word = translation.find_elements(By.CSS_SELECTOR, ".word")[target]
        ActionChains(browser).move_to_element(word).perform()
        marked = {int(span.get_attribute("data-index")) for span in browser.find_elements(
            By.CSS_SELECTOR, ".result .source .word.highlight")}
        assert source in marked and marked == sources
        assert "highlight" in word.get_attribute("class")
        # The keyboard does the same: focus moves the mark.
        ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "h1")).perform()
        assert not browser.find_elements(By.CSS_SELECTOR, ".source .word.highlight")
        browser.execute_script("arguments[0].focus()", word)
        assert browser.find_elements(By.CSS_SELECTOR, ".source .word.highlight")
        alternatives = browser.find_elements(By.CSS_SELECTOR, ".result details li")
        assert len(alternatives) == len(expected["n_best"])
        # Nothing wider than the phone's screen.
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= window.innerWidth")
        screenshot = os.environ.get("KERAS_TRANSFORMER_PAGE_SCREENSHOT")
        browser.save_screenshot(screenshot or str(tmp_path / "page.png"))

# ruff: noqa: E501, RUF001 - phrase lists in Chinese, full-width punctuation on purpose
"""The article evaluation set (issue #24): blog pages generated for the project, with truth.

:func:`pages` yields :class:`Sample` pages -- WordPress, Hexo, Hugo, cnblogs and Medium-like
markup, in English (UTF-8), simplified Chinese (UTF-8 and GBK) and traditional Chinese (Big5),
each with three kinds of metadata (JSON-LD + meta tags, meta tags only, visible byline only).
Each article has paragraphs, a subheading, a list and, on every third page, a code block;
each page carries navigation, a sidebar, related posts, comments and a footer around the
article, so main-text extraction has boilerplate to leave out. The text is made up here from
phrase lists (licence-clean, deterministic: the same set on every run). :func:`token_f1` is
the token-level F1 used to score extracted text (a CJK character is one token).
"""

from __future__ import annotations

import html
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Sample", "pages", "token_f1"]

STYLES = ("wordpress", "hexo", "hugo", "cnblogs", "medium")
LANGS = (("en", "utf-8"), ("zh-CN", "utf-8"), ("zh-CN", "gbk"), ("zh-TW", "big5"))
KINDS = ("jsonld", "meta", "byline")


@dataclass(frozen=True)
class Sample:
    name: str
    url: str
    body: bytes
    content_type: str
    text: str  # the article's main text, paragraphs joined by newlines
    author: str
    date: str  # YYYY-MM-DD
    title: str
    language: str
    charset: str
    style: str


_EN_SUBJECTS = ["The scheduler", "Our crawler", "Each consumer", "The frontier", "A producer",
                "The coordination layer", "This design", "The queue", "Every worker thread",
                "The politeness gate", "A lease", "The sink"]
_EN_VERBS = ["keeps", "spreads", "records", "measures", "throttles", "retries", "hands over",
             "batches", "decodes", "checks", "releases", "orders"]
_EN_OBJECTS = ["the pending requests per host", "every fetched page", "its own heartbeat",
               "the dead letters", "a bounded backlog", "the robots rules of each site",
               "the timing of each stage", "a checkpoint in the tree", "items in batches",
               "charset declarations", "leases that expired", "the partitions it owns"]
_EN_TAILS = ["before the next pass begins", "without asking the ensemble twice",
             "so that no host sees a burst", "while the others keep fetching",
             "and nothing is lost on a restart", "in the order they were offered",
             "when the session expires", "at a steady pace"]
_ZH_S = ["调度器", "我们的爬虫", "每个消费者", "生产者", "协调层", "这个设计", "队列", "每个工作线程",
         "礼貌控制", "租约机制", "结果存储", "监控模块"]
_ZH_V = ["保存了", "分配了", "记录了", "测量了", "限制了", "重试了", "交出了", "批量处理了", "解码了",
         "检查了", "释放了", "排列了"]
_ZH_O = ["每个主机的待处理请求", "每一个抓取到的页面", "自己的心跳信息", "失败的死信", "有界的积压队列",
         "每个网站的抓取规则", "每个阶段的耗时", "树中的检查点", "成批的任务", "字符集声明",
         "已经过期的租约", "它拥有的分区"]
_ZH_T = ["然后才开始下一轮", "不必重复询问集群", "这样没有主机会突然收到大量请求", "其他节点继续抓取",
         "重启之后什么也不会丢失", "按照提交的顺序", "当会话过期的时候", "保持稳定的速度"]
_TW_S = ["調度器", "我們的爬蟲", "每個消費者", "生產者", "協調層", "這個設計", "佇列", "每個工作執行緒",
         "禮貌控制", "租約機制", "結果儲存", "監控模組"]
_TW_V = ["保存了", "分配了", "記錄了", "測量了", "限制了", "重試了", "交出了", "批次處理了", "解碼了",
         "檢查了", "釋放了", "排列了"]
_TW_O = ["每個主機的待處理請求", "每一個抓取到的頁面", "自己的心跳資訊", "失敗的死信", "有界的積壓佇列",
         "每個網站的抓取規則", "每個階段的耗時", "樹中的檢查點", "成批的任務", "字元集宣告",
         "已經過期的租約", "它擁有的分區"]
_TW_T = ["然後才開始下一輪", "不必重複詢問叢集", "這樣沒有主機會突然收到大量請求", "其他節點繼續抓取",
         "重新啟動之後什麼也不會遺失", "按照提交的順序", "當工作階段過期的時候", "保持穩定的速度"]
_AUTHORS = {"en": ["Alice Walker", "Bruno Costa", "Chen Wei", "Dana Fischer", "Emil Novak"],
            "zh-CN": ["张三", "李小龙", "王芳", "赵海涛", "陈静"],
            "zh-TW": ["林志明", "黃美玲", "張家豪", "吳淑芬", "劉建國"]}
_WORDS = {"en": ("Notes on", "Designing", "Lessons from", "Tuning", "Debugging"),
          "zh-CN": ("关于", "设计", "经验：", "调优", "排查"),
          "zh-TW": ("關於", "設計", "經驗：", "調校", "排查")}
_TOPICS = {"en": ("crawl leases", "host politeness", "batched offers", "charset detection",
                  "dead letters", "session expiry"),
           "zh-CN": ("抓取租约", "主机礼貌", "批量提交", "字符集检测", "死信队列", "会话过期"),
           "zh-TW": ("抓取租約", "主機禮貌", "批次提交", "字元集偵測", "死信佇列", "工作階段過期")}
_UI = {"en": {"home": "Home", "about": "About", "archive": "Archives", "recent": "Recent posts",
              "comments": "Comments", "reply": "Reply", "related": "Related posts",
              "share": "Share this", "rights": "All rights reserved", "read": "min read",
              "by": "By", "posted": "Posted on", "tags": "Tags"},
       "zh-CN": {"home": "首页", "about": "关于", "archive": "归档", "recent": "最新文章",
                 "comments": "评论", "reply": "回复", "related": "相关文章", "share": "分享",
                 "rights": "版权所有", "read": "分钟阅读", "by": "作者", "posted": "发表于",
                 "tags": "标签"},
       "zh-TW": {"home": "首頁", "about": "關於", "archive": "歸檔", "recent": "最新文章",
                 "comments": "留言", "reply": "回覆", "related": "相關文章", "share": "分享",
                 "rights": "版權所有", "read": "分鐘閱讀", "by": "作者", "posted": "發表於",
                 "tags": "標籤"}}


def _sentence(rng: random.Random, lang: str) -> str:
    if lang == "en":
        return (f"{rng.choice(_EN_SUBJECTS)} {rng.choice(_EN_VERBS)} "
                f"{rng.choice(_EN_OBJECTS)} {rng.choice(_EN_TAILS)}.")
    s, v, o, t = (_ZH_S, _ZH_V, _ZH_O, _ZH_T) if lang == "zh-CN" else (_TW_S, _TW_V, _TW_O, _TW_T)
    return f"{rng.choice(s)}{rng.choice(v)}{rng.choice(o)}，{rng.choice(t)}。"


def _paragraph(rng: random.Random, lang: str, n: int) -> str:
    return ("" if lang != "en" else " ").join(_sentence(rng, lang) for _ in range(n)).strip()


@dataclass
class _Post:
    style: str
    lang: str
    kind: str
    title: str
    author: str
    date: str
    time: str
    paragraphs: list[str]
    tags: list[str]
    comments: list[str]
    recent: list[str]
    url: str
    description: str
    heading: str = ""
    items: tuple[str, ...] = ()
    code: str = ""

    def blocks(self) -> list[tuple[str, str]]:
        """The article body in order, (kind, text): what the truth text is made of."""
        out = [("p", x) for x in self.paragraphs[:2]]
        out += [("h2", self.heading)] + [("li", x) for x in self.items]
        if self.code:
            out.append(("pre", self.code))
        return out + [("p", x) for x in self.paragraphs[2:]]


def _post(index: int, style: str, lang: str, kind: str) -> _Post:
    rng = random.Random(f"article-{index}")
    base = "zh-CN" if lang == "zh-CN" else lang
    title = f"{rng.choice(_WORDS[base])} {rng.choice(_TOPICS[base])} ({index})"
    if lang != "en":
        title = title.replace(" ", "")
    paragraphs = [_paragraph(rng, base, rng.randint(3, 6)) for _ in range(rng.randint(4, 7))]
    comments = [_paragraph(rng, base, rng.randint(1, 2)) for _ in range(rng.randint(1, 3))]
    recent = [f"{rng.choice(_WORDS[base])} {rng.choice(_TOPICS[base])}" for _ in range(5)]
    day = f"20{rng.randint(15, 25):02d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    clock = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00"
    tags = rng.sample(list(_TOPICS[base]), 2)
    url = f"https://{style}.example.org/{day.replace('-', '/')}/post-{index}/"
    author = rng.choice(_AUTHORS[base])
    heading = f"{rng.choice(_WORDS[base])} {rng.choice(_TOPICS[base])}"
    items = tuple(_sentence(rng, base) for _ in range(3))
    code = (f"zkcrawl-consumer --threads {rng.randint(2, 64)} --extract article"
            if index % 3 == 0 else "")
    return _Post(style, lang, kind, title, author, day, clock, paragraphs, tags, comments,
                 recent, url, paragraphs[0][:60], heading, items, code)


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _head(p: _Post, charset: str) -> str:
    parts = [f'<meta charset="{charset}">', f"<title>{_esc(p.title)} | {p.style} blog</title>",
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             '<link rel="stylesheet" href="/css/main.css">']
    if p.kind != "byline":
        parts += [f'<meta name="author" content="{_esc(p.author)}">',
                  f'<meta name="description" content="{_esc(p.description)}">',
                  f'<meta property="og:title" content="{_esc(p.title)}">',
                  f'<meta property="article:published_time" content="{p.date}T{p.time}+08:00">',
                  f'<link rel="canonical" href="{p.url}">']
        parts += [f'<meta property="article:tag" content="{_esc(t)}">' for t in p.tags]
    if p.kind == "jsonld":
        obj = {"@context": "https://schema.org", "@type": "BlogPosting", "headline": p.title,
               "author": {"@type": "Person", "name": p.author},
               "datePublished": f"{p.date}T{p.time}+08:00", "keywords": p.tags,
               "mainEntityOfPage": p.url}
        import json
        data = json.dumps(obj, ensure_ascii=False)
        if p.style == "wordpress":  # Yoast-style graph
            data = json.dumps({"@context": "https://schema.org", "@graph": [
                {"@type": "WebSite", "name": "blog"}, obj]}, ensure_ascii=False)
        parts.append(f'<script type="application/ld+json">{data}</script>')
    parts.append("<script>window.dataLayer=window.dataLayer||[];function gtag(){}</script>")
    return "\n".join(parts)


def _nav(p: _Post) -> str:
    ui = _UI[p.lang if p.lang != "zh-TW" else "zh-TW"]
    links = "".join(f'<li><a href="/{k}/">{_esc(ui[k])}</a></li>'
                    for k in ("home", "archive", "about"))
    return f'<header class="site-header"><nav class="menu"><ul>{links}</ul></nav></header>'


def _sidebar(p: _Post) -> str:
    ui = _UI[p.lang]
    items = "".join(f'<li><a href="/p/{i}/">{_esc(t)}</a></li>' for i, t in enumerate(p.recent))
    return (f'<aside class="sidebar widget-area"><section class="widget"><h2 class="widget-title">'
            f"{_esc(ui['recent'])}</h2><ul>{items}</ul></section></aside>")


def _comments(p: _Post) -> str:
    ui = _UI[p.lang]
    items = "".join(f'<li class="comment"><div class="comment-author">user{i}</div>'
                    f'<div class="comment-content"><p>{_esc(c)}</p></div>'
                    f'<a class="reply" href="#r{i}">{_esc(ui["reply"])}</a></li>'
                    for i, c in enumerate(p.comments))
    return (f'<div id="comments" class="comments-area"><h2 class="comments-title">'
            f"{_esc(ui['comments'])}</h2><ol class=\"comment-list\">{items}</ol></div>")


def _footer(p: _Post) -> str:
    ui = _UI[p.lang]
    return (f'<footer class="site-footer"><p>&copy; 2025 {p.style} blog. {_esc(ui["rights"])}.'
            f'</p><p><a href="/feed/">RSS</a> &middot; <a href="/privacy/">Privacy</a></p></footer>')


def _body_html(p: _Post, tag: str = "p", cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    out: list[str] = []
    for kind, text in p.blocks():
        if kind == "p":
            out.append(f"<{tag}{attr}>{_esc(text)}</{tag}>")
        elif kind == "h2":
            out.append(f"<h2>{_esc(text)}</h2><ul>")
        elif kind == "li":
            out.append(f"<li>{_esc(text)}</li>")
        else:
            out.append(f"<pre><code>{_esc(text)}</code></pre>")
        if kind == "li" and (not out or text == p.items[-1]):
            out.append("</ul>")
    return "\n".join(out)


def _byline(p: _Post) -> str:
    ui = _UI[p.lang]
    return (f'<span class="posted-on">{_esc(ui["posted"])} <time class="entry-date published" '
            f'datetime="{p.date}T{p.time}+08:00">{p.date}</time></span> '
            f'<span class="byline">{_esc(ui["by"])} <span class="author vcard">'
            f'<a class="url fn n" href="/author/a/">{_esc(p.author)}</a></span></span>')


def _wordpress(p: _Post) -> str:
    tags = "".join(f'<a href="/tag/{i}/" rel="tag">{_esc(t)}</a> ' for i, t in enumerate(p.tags))
    return (f'<body class="post-template-default single single-post">{_nav(p)}'
            f'<div id="content" class="site-content"><main id="main" class="site-main">'
            f'<article id="post-1" class="post type-post status-publish">'
            f'<header class="entry-header"><h1 class="entry-title">{_esc(p.title)}</h1>'
            f'<div class="entry-meta">{_byline(p)}</div></header>'
            f'<div class="entry-content">{_body_html(p)}</div>'
            f'<footer class="entry-footer"><span class="tags-links">{tags}</span></footer>'
            f'</article>{_comments(p)}</main>{_sidebar(p)}</div>{_footer(p)}</body>')


def _hexo(p: _Post) -> str:
    ui = _UI[p.lang]
    return (f'<body itemscope itemtype="http://schema.org/WebPage"><div class="container">'
            f'{_nav(p)}<main class="main"><div class="content-wrap"><div class="content post">'
            f'<article itemscope itemtype="http://schema.org/Article" class="post-block">'
            f'<header class="post-header"><h1 class="post-title" itemprop="name headline">'
            f'{_esc(p.title)}</h1><div class="post-meta"><span class="post-meta-item">'
            f'{_esc(ui["posted"])} <time title="{p.date}" itemprop="dateCreated datePublished" '
            f'datetime="{p.date}T{p.time}+08:00">{p.date}</time></span>'
            f'<span class="post-meta-item" itemprop="author" itemscope '
            f'itemtype="http://schema.org/Person"><span itemprop="name">{_esc(p.author)}</span>'
            f'</span></div></header><div class="post-body" itemprop="articleBody">'
            f'{_body_html(p)}</div><footer class="post-footer"><div class="post-nav">'
            f'<a href="/p/prev/" rel="prev">{_esc(p.recent[0])}</a></div></footer></article>'
            f'</div>{_comments(p)}</div>{_sidebar(p)}</main>{_footer(p)}</div></body>')


def _hugo(p: _Post) -> str:
    ui = _UI[p.lang]
    tags = "".join(f'<li><a href="/tags/{i}/">{_esc(t)}</a></li>' for i, t in enumerate(p.tags))
    return (f'<body class="single">{_nav(p)}<main class="main"><article class="post-single">'
            f'<header class="post-header"><h1 class="post-title">{_esc(p.title)}</h1>'
            f'<div class="post-meta"><span title="{p.date}">{p.date}</span>&nbsp;&middot;&nbsp;3 '
            f'{_esc(ui["read"])}&nbsp;&middot;&nbsp;{_esc(p.author)}</div></header>'
            f'<div class="post-content">{_body_html(p)}</div><footer class="post-footer">'
            f'<ul class="post-tags">{tags}</ul><nav class="paginav"><a class="prev" href="/p/0/">'
            f'<span class="title">&laquo; Prev</span><br><span>{_esc(p.recent[1])}</span></a></nav>'
            f'<div class="share-buttons"><a href="#">{_esc(ui["share"])}</a></div></footer>'
            f'</article>{_comments(p)}</main>{_footer(p)}</body>')


def _cnblogs(p: _Post) -> str:
    ui = _UI[p.lang]
    return (f'<body><div id="home"><div id="header"><div id="blogTitle"><h1><a id="Header1_'
            f'HeaderTitle" href="/u/">{_esc(p.author)}</a></h1></div>{_nav(p)}</div>'
            f'<div id="main"><div id="mainContent"><div class="forFlow"><div id="post_detail">'
            f'<div id="topics"><div class="post"><h1 class="postTitle"><a id="cb_post_title_url"'
            f' class="postTitle2" href="{p.url}"><span>{_esc(p.title)}</span></a></h1>'
            f'<div class="clear"></div><div class="postBody"><div id="cnblogs_post_body" '
            f'class="blogpost-body cnblogs-markdown">{_body_html(p)}</div>'
            f'<div id="blog_post_info_block"><div id="BlogPostCategory"></div></div></div>'
            f'<div class="postDesc">posted @ <span id="post-date">{p.date} {p.time[:5]}</span>'
            f'&nbsp;<a href="/u/">{_esc(p.author)}</a>&nbsp; {_esc(ui["read"])}(123)&nbsp; '
            f'{_esc(ui["comments"])}(4)</div></div></div></div>{_comments(p)}</div></div>'
            f'<div id="sideBar">{_sidebar(p)}</div></div>{_footer(p)}</div></body>')


def _medium(p: _Post) -> str:
    ui = _UI[p.lang]
    body = _body_html(p, "p", "pw-post-body-paragraph")
    return (f'<body><div id="root"><div class="a b c">{_nav(p)}<article><div class="l">'
            f'<section><div class="m"><h1 class="pw-post-title">{_esc(p.title)}</h1>'
            f'<div class="pw-author"><a data-testid="authorName" href="/@a">{_esc(p.author)}'
            f'</a><span data-testid="storyReadTime">4 {_esc(ui["read"])}</span> &middot; '
            f'<span data-testid="storyPublishDate">{p.date}</span></div>{body}</div></section>'
            f'</div></article><div class="clap"><button>{_esc(ui["share"])}</button></div>'
            f'{_comments(p)}<div class="more"><h2>{_esc(ui["related"])}</h2>{_sidebar(p)}</div>'
            f'{_footer(p)}</div></div></body>')


_RENDER = {"wordpress": _wordpress, "hexo": _hexo, "hugo": _hugo, "cnblogs": _cnblogs,
           "medium": _medium}


def _render(p: _Post, charset: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="{p.lang}"><head>\n{_head(p, charset)}\n</head>\n'
            f"{_RENDER[p.style](p)}\n</html>\n")


def pages() -> Iterator[Sample]:
    """The evaluation set: 5 styles x 4 language/encodings x 3 metadata kinds = 60 pages."""
    index = 0
    for style in STYLES:
        for lang, charset in LANGS:
            for kind in KINDS:
                index += 1
                p = _post(index, style, lang, kind)
                body = _render(p, charset).encode(charset)  # strict: the set is encodable
                # Half declare the charset in the header too, half only in <meta>.
                ctype = "text/html" if index % 2 else f"text/html; charset={charset}"
                yield Sample(f"{style}-{lang}-{charset}-{kind}", p.url, body, ctype,
                             "\n".join(t for _, t in p.blocks()), p.author, p.date, p.title,
                             p.lang,
                             charset, style)


_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W_]+")


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def token_f1(found: str | None, truth: str) -> float:
    """Bag-of-tokens F1 of ``found`` against ``truth`` (0.0 for nothing found)."""
    got, want = Counter(tokens(found or "")), Counter(tokens(truth))
    common = sum((got & want).values())
    if not common:
        return 0.0
    precision, recall = common / sum(got.values()), common / sum(want.values())
    return 2 * precision * recall / (precision + recall)

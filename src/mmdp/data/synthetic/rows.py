"""A synthetic visual-question-answering mixture in the_cauldron's schema, generated offline.

The blog trains on `HuggingFaceM4/the_cauldron` (subset ai2d), which needs the Hub. This module draws a
deterministic stand-in with the same columns:

    images: list of PIL images            texts: list of {"user", "assistant", "source"}

and the traits of a real VLM training mixture that matter for padding and packing: several tasks,
0 to 3 images per sample, one to eight turns, short answers next to long descriptions (a long-tailed
token-length distribution). Every answer is correct by construction: it is written from the same
scene that is drawn.

Row i depends only on (seed, i), so a larger dataset starts with the rows of a smaller one.

Tasks (the `source` of each turn):
- count:     "How many circles are there?"               shapes on a grid, one per cell
- colour:    "What colour is the triangle?"
- chart:     "What is the value for Tue?"                a labelled bar chart
- diagram:   ai2d-style multiple choice on a food chain drawn with boxes and arrows
- describe:  a long, detailed description of every shape (the long tail)
- compare:   "Which image has the most squares?" across 2 or 3 images
- multiturn: several questions about one image, some with long answers
- text_only: arithmetic, spelling, sorting, capitals: no image (mixtures used to train VLMs
             keep some text-only data; it is also what fills the gaps of packs)
"""

import io
import random

from PIL import Image, ImageDraw, ImageFont

# Colour names and their exact RGB values (drawing without anti-aliasing keeps them exact).
COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
    "purple": (140, 60, 180),
    "orange": (245, 130, 20),
    "black": (20, 20, 20),
}
BACKGROUND = (255, 255, 255)
SHAPES = ("circle", "square", "triangle")
SIZES = ("small", "medium", "large")
ROWS_NAMES = ("top", "upper middle", "lower middle", "bottom")
COLS_NAMES = ("left", "centre left", "centre right", "right")

# Task mixture: name -> weight. Short answers dominate, as in real mixtures; long ones form the tail.
TASK_WEIGHTS = {
    "count": 22,
    "colour": 14,
    "chart": 14,
    "diagram": 14,
    "describe": 12,
    "compare": 10,
    "multiturn": 10,
    "text_only": 16,
}

GRID = 4  # shapes sit one per cell of a GRID x GRID grid, so they never overlap


def generate_row(index: int, seed: int = 0) -> dict:
    """Return row `index` of the synthetic dataset: {"images": [PIL...], "texts": [{...}]}."""
    rng = random.Random(f"mmdp-synthetic-{seed}-{index}")
    task = rng.choices(list(TASK_WEIGHTS), weights=list(TASK_WEIGHTS.values()))[0]
    images, turns = TASKS[task](rng)
    texts = [{"user": user, "assistant": assistant, "source": task} for user, assistant in turns]
    return {"images": images, "texts": texts}


def encode_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


# ----------------------------------------------------------------------------------------------
# Scenes of shapes


def random_scene(rng: random.Random, min_shapes: int = 1, max_shapes: int = 10) -> list[dict]:
    """Shapes, each in its own grid cell: [{"shape", "colour", "size", "row", "col"}, ...]."""
    cells = rng.sample([(r, c) for r in range(GRID) for c in range(GRID)], GRID * GRID)
    count = rng.randint(min_shapes, max_shapes)
    return [
        {
            "shape": rng.choice(SHAPES),
            "colour": rng.choice(list(COLOURS)),
            "size": rng.choice(SIZES),
            "row": row,
            "col": col,
        }
        for row, col in cells[:count]
    ]


def draw_scene(scene: list[dict], side: int) -> Image.Image:
    image = Image.new("RGB", (side, side), BACKGROUND)
    draw = ImageDraw.Draw(image)
    cell = side / GRID
    for item in scene:
        scale = {"small": 0.35, "medium": 0.55, "large": 0.8}[item["size"]]
        centre = ((item["col"] + 0.5) * cell, (item["row"] + 0.5) * cell)
        draw_shape(draw, item["shape"], item["colour"], centre, cell * scale / 2)
    return image


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, colour: str, centre, half: float) -> None:
    """A filled circle, square or triangle of half-width `half` around `centre`."""
    cx, cy = centre
    box = [cx - half, cy - half, cx + half, cy + half]
    if shape == "circle":
        draw.ellipse(box, fill=COLOURS[colour])
    elif shape == "square":
        draw.rectangle(box, fill=COLOURS[colour])
    else:
        triangle = [(cx, cy - half), (cx + half, cy + half), (cx - half, cy + half)]
        draw.polygon(triangle, fill=COLOURS[colour])


def plural(word: str, n: int) -> str:
    return word if n == 1 else word + "s"


def scene_image(rng: random.Random, scene: list[dict]) -> Image.Image:
    return draw_scene(scene, side=rng.choice((192, 224, 256, 320, 384, 448)))


def count_of(scene: list[dict], shape: str) -> int:
    return sum(item["shape"] == shape for item in scene)


def describe_shape(item: dict) -> str:
    where = f"{ROWS_NAMES[item['row']]} {COLS_NAMES[item['col']]}"
    return f"a {item['size']} {item['colour']} {item['shape']} in the {where} of the image"


def count_turn(rng: random.Random, scene: list[dict]) -> tuple[str, str]:
    shape = rng.choice(SHAPES)
    n = count_of(scene, shape)
    question = rng.choice(
        (
            f"How many {shape}s are there in the image?",
            f"Count the {shape}s in the picture.",
            f"How many {shape}s can you see?",
        )
    )
    answer = rng.choice((str(n), f"There {'is' if n == 1 else 'are'} {n} {plural(shape, n)}."))
    return question, answer


def colour_turn(rng: random.Random, scene: list[dict]) -> tuple[str, str]:
    # Ask about a shape kind that appears exactly once, so the answer is unambiguous.
    unique = [item for item in scene if count_of(scene, item["shape"]) == 1]
    if not unique:
        item = rng.choice(scene)
        where = f"{ROWS_NAMES[item['row']]} {COLS_NAMES[item['col']]}"
        return f"What colour is the shape in the {where}?", item["colour"].capitalize() + "."
    item = rng.choice(unique)
    return f"What colour is the {item['shape']}?", item["colour"].capitalize() + "."


def task_count(rng):
    scene = random_scene(rng)
    return [scene_image(rng, scene)], [count_turn(rng, scene)]


def task_colour(rng):
    scene = random_scene(rng, 1, 6)
    return [scene_image(rng, scene)], [colour_turn(rng, scene)]


def task_describe(rng):
    # The long tail: up to all 16 cells filled, and sometimes a very detailed answer.
    scene = random_scene(rng, 3, GRID * GRID)
    counts = ", ".join(f"{count_of(scene, s)} {plural(s, count_of(scene, s))}" for s in SHAPES)
    parts = [f"The image shows {len(scene)} shapes on a white background: {counts}."]
    # Some answers also relate every shape to its neighbours: the longest rows of the mixture.
    very_detailed = rng.random() < 0.35
    by_cell = {(item["row"], item["col"]): item for item in scene}
    for number, item in enumerate(sorted(scene, key=lambda i: (i["row"], i["col"])), start=1):
        parts.append(f"Shape {number} is {describe_shape(item)}.")
        if very_detailed:
            right = by_cell.get((item["row"], item["col"] + 1))
            below = by_cell.get((item["row"] + 1, item["col"]))
            parts.append(
                f"To its right is {'a ' + right['colour'] + ' ' + right['shape'] if right else 'empty space'}, "
                f"and below it is {'a ' + below['colour'] + ' ' + below['shape'] if below else 'empty space'}."
            )
    if rng.random() < 0.5:
        colours = sorted({item["colour"] for item in scene})
        parts.append(
            f"The colours used are {', '.join(colours)}. No two shapes overlap, and each one sits "
            "in its own cell of an invisible four by four grid, which makes the picture look tidy."
        )
    question = rng.choice(
        (
            "Describe this image in detail.",
            "Give a detailed description of everything you see in the image.",
            "What is shown in this picture? Be thorough.",
        )
    )
    return [scene_image(rng, scene)], [(question, " ".join(parts))]


def task_compare(rng):
    scenes = [random_scene(rng, 1, 8) for _ in range(rng.choice((2, 2, 3)))]
    shape = rng.choice(SHAPES)
    counts = [count_of(scene, shape) for scene in scenes]
    best = max(counts)
    winners = [i + 1 for i, c in enumerate(counts) if c == best]
    listing = ", ".join(f"image {i + 1} has {c}" for i, c in enumerate(counts))
    if len(winners) == 1:
        answer = f"Image {winners[0]} has the most {shape}s: {listing}."
    else:
        answer = f"There is a tie between images {' and '.join(map(str, winners))}: {listing}."
    question = f"Which of these {len(scenes)} images contains the most {shape}s?"
    return [scene_image(rng, scene) for scene in scenes], [(question, answer)]


def task_multiturn(rng):
    scene = random_scene(rng, 2, 12)
    turns = []
    for _ in range(rng.randint(2, 8)):
        kind = rng.choice(("count", "colour", "where", "total"))
        if kind == "count":
            turns.append(count_turn(rng, scene))
        elif kind == "colour":
            turns.append(colour_turn(rng, scene))
        elif kind == "where":
            item = rng.choice(scene)
            alike = [
                i for i in scene if (i["shape"], i["colour"]) == (item["shape"], item["colour"])
            ]
            answer = (
                f"There is {describe_shape(item)}."
                if len(alike) == 1
                else "There is more than one: " + "; ".join(map(describe_shape, alike)) + "."
            )
            turns.append((f"Where is the {item['colour']} {item['shape']}?", answer))
        else:
            turns.append(("How many shapes are there in total?", str(len(scene))))
    first = {}
    for question, answer in turns:  # the same question twice reads oddly: keep the first
        first.setdefault(question, answer)
    return [scene_image(rng, scene)], list(first.items())


# ----------------------------------------------------------------------------------------------
# Bar charts

CATEGORIES = (
    ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"),
    ("Apples", "Pears", "Plums", "Grapes", "Lemons", "Kiwis"),
    ("North", "South", "East", "West", "Centre"),
    ("2019", "2020", "2021", "2022", "2023", "2024"),
)


def font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def draw_bar_chart(labels: list[str], values: list[int], title: str) -> Image.Image:
    width, height = 80 + 60 * len(labels), 320
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    bottom, scale = height - 40, (height - 90) / 100
    draw.text((10, 8), title, fill=COLOURS["black"], font=font(16))
    draw.line([(40, bottom), (width - 10, bottom)], fill=COLOURS["black"], width=2)
    for i, (label, value) in enumerate(zip(labels, values)):
        x = 55 + 60 * i
        draw.rectangle([x, bottom - value * scale, x + 36, bottom], fill=COLOURS["blue"])
        draw.text(
            (x + 4, bottom - value * scale - 16), str(value), fill=COLOURS["black"], font=font(12)
        )
        draw.text((x, bottom + 8), label, fill=COLOURS["black"], font=font(12))
    return image


def task_chart(rng):
    labels = list(rng.choice(CATEGORIES))
    labels = labels[: rng.randint(3, len(labels))]
    values = [rng.randint(5, 100) for _ in labels]
    title = rng.choice(("Sales", "Visitors", "Rainfall (mm)", "Scores"))
    image = draw_bar_chart(labels, values, title)
    kind = rng.choice(("value", "max", "min", "sum"))
    if kind == "value":
        i = rng.randrange(len(labels))
        turn = (f"What is the value for {labels[i]} in this chart?", str(values[i]))
    elif kind in ("max", "min"):
        extreme = max(values) if kind == "max" else min(values)
        names = " and ".join(label for label, v in zip(labels, values) if v == extreme)
        turn = (f"Which category has the {'highest' if kind == 'max' else 'lowest'} value?", names)
    else:
        listing = " + ".join(map(str, values))
        turn = (
            "What is the total of all the bars? Show your working.",
            f"Reading each bar from left to right: {listing} = {sum(values)}.",
        )
    return [image], [turn]


# ----------------------------------------------------------------------------------------------
# ai2d-style diagrams: a food chain drawn as boxes and arrows, with a multiple-choice question

ORGANISMS = (
    "grass",
    "algae",
    "seeds",
    "leaves",
    "grasshopper",
    "caterpillar",
    "mouse",
    "rabbit",
    "frog",
    "snake",
    "owl",
    "hawk",
    "fox",
    "small fish",
    "heron",
    "eagle",
)


def draw_food_chain(chain: list[str]) -> Image.Image:
    box_w, gap = 110, 40
    width, height = 20 + len(chain) * (box_w + gap), 140
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    for i, name in enumerate(chain):
        x = 20 + i * (box_w + gap)
        draw.rectangle([x, 50, x + box_w, 90], outline=COLOURS["black"], width=2)
        draw.text((x + 8, 62), name, fill=COLOURS["black"], font=font(13))
        if i + 1 < len(chain):
            x_end = x + box_w + gap - 4
            draw.line([(x + box_w + 2, 70), (x_end, 70)], fill=COLOURS["red"], width=3)
            draw.polygon([(x_end, 70), (x_end - 10, 63), (x_end - 10, 77)], fill=COLOURS["red"])
    return image


def task_diagram(rng):
    chain = rng.sample(ORGANISMS, rng.randint(3, 5))
    i = rng.randrange(len(chain) - 1)
    kind = rng.choice(("eats", "eaten_by", "producer"))
    if kind == "eats":
        question, answer = f"In this food chain, what does the {chain[i + 1]} eat?", chain[i]
    elif kind == "eaten_by":
        question, answer = f"In this food chain, what eats the {chain[i]}?", chain[i + 1]
    else:
        question, answer = "Which organism is the producer in this food chain?", chain[0]
    options = [answer] + rng.sample([o for o in ORGANISMS if o != answer], 3)
    rng.shuffle(options)
    letters = "ABCD"
    listing = "\n".join(f"{letter}. {option}" for letter, option in zip(letters, options))
    user = f"{question}\nOptions:\n{listing}\nAnswer with the option's letter from the given choices directly."
    return [draw_food_chain(chain)], [(user, letters[options.index(answer)])]


# ----------------------------------------------------------------------------------------------
# Text-only rows


WORDS = ("circle", "triangle", "square", "diagram", "picture", "colour", "market", "garden")
CAPITALS = {
    "France": "Paris",
    "Japan": "Tokyo",
    "Kenya": "Nairobi",
    "Peru": "Lima",
    "Norway": "Oslo",
}


def task_text_only(rng):
    kind = rng.choice(("multiply", "reverse", "capital", "sort"))
    if kind == "multiply":
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        return [], [(f"What is {a} times {b}?", f"{a} times {b} is {a * b}.")]
    if kind == "reverse":
        word = rng.choice(WORDS)
        return [], [(f"Spell the word '{word}' backwards.", word[::-1])]
    if kind == "capital":
        country = rng.choice(list(CAPITALS))
        answer = f"The capital of {country} is {CAPITALS[country]}."
        return [], [(f"What is the capital of {country}?", answer)]
    numbers = [rng.randint(1, 99) for _ in range(rng.randint(3, 8))]
    question = f"Sort these numbers from smallest to largest: {', '.join(map(str, numbers))}."
    return [], [(question, ", ".join(map(str, sorted(numbers))))]


TASKS = {
    "count": task_count,
    "colour": task_colour,
    "chart": task_chart,
    "diagram": task_diagram,
    "describe": task_describe,
    "compare": task_compare,
    "multiturn": task_multiturn,
    "text_only": task_text_only,
}
